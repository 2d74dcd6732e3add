//! A text with `{variables}` from the request it is written for: a redirect's `location`, a
//! header rule's value. Parsed once when the file is read; rendered for each request.

use std::fmt;
use std::net::IpAddr;

use crate::http1::request::{RequestHead, host_without_port};

/// A text with `{variables}`: `{scheme}`, `{host}` (without port), `{uri}` (the target as
/// received, query included), `{path}` (without the query), `{query}` (without its `?`),
/// `{is_args}` (`?` when the query is not empty, as nginx's `$is_args`: `{path}{is_args}{query}`
/// keeps a query without leaving a bare `?`), `{client_ip}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub Vec<TemplatePart>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variable {
    Scheme,
    Host,
    Uri,
    Path,
    Query,
    IsArgs,
    ClientIp,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Text(String),
    Var(Variable),
}

impl Template {
    pub const VARIABLES: &'static str =
        "{scheme}, {host}, {uri}, {path}, {query}, {is_args}, {client_ip}";

    /// Reads `{name}` variables out of `s`; `{{` and `}}` are literal braces.
    pub fn parse(s: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(i) = rest.find(['{', '}']) {
            text.push_str(&rest[..i]);
            let tail = &rest[i..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                text.push_str(&tail[..1]);
                rest = &tail[2..];
                continue;
            }
            if tail.starts_with('}') {
                return Err(format!(
                    "unmatched '}}' in \"{s}\" (write '}}}}' for a brace)"
                ));
            }
            let Some(end) = tail.find('}') else {
                return Err(format!("unclosed '{{' in \"{s}\""));
            };
            let var = match &tail[1..end] {
                "scheme" => Variable::Scheme,
                "host" => Variable::Host,
                "uri" => Variable::Uri,
                "path" => Variable::Path,
                "query" => Variable::Query,
                "is_args" => Variable::IsArgs,
                "client_ip" => Variable::ClientIp,
                other => {
                    return Err(format!(
                        "unknown variable {{{other}}}, expected one of {}",
                        Template::VARIABLES
                    ));
                }
            };
            if !text.is_empty() {
                parts.push(TemplatePart::Text(std::mem::take(&mut text)));
            }
            parts.push(TemplatePart::Var(var));
            rest = &tail[end + 1..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            parts.push(TemplatePart::Text(text));
        }
        Ok(Template(parts))
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.0 {
            match part {
                TemplatePart::Text(t) => f.write_str(&t.replace('{', "{{").replace('}', "}}"))?,
                TemplatePart::Var(v) => f.write_str(match v {
                    Variable::Scheme => "{scheme}",
                    Variable::Host => "{host}",
                    Variable::Uri => "{uri}",
                    Variable::Path => "{path}",
                    Variable::Query => "{query}",
                    Variable::IsArgs => "{is_args}",
                    Variable::ClientIp => "{client_ip}",
                })?,
            }
        }
        Ok(())
    }
}

/// What a template is rendered for: a request, whether it came over TLS, and its client.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub head: &'a RequestHead,
    pub https: bool,
    pub client: IpAddr,
}

impl Template {
    /// Writes the template for `request`: `{host}` without its port, `{uri}` the target as
    /// received (origin-form, query included), `{path}` and `{query}` its two parts.
    pub(crate) fn render(&self, request: &Request<'_>, out: &mut Vec<u8>) {
        let Request {
            head,
            https,
            client,
        } = *request;
        let target = head.path();
        let (path, query) = match target.iter().position(|&b| b == b'?') {
            Some(q) => (&target[..q], &target[q + 1..]),
            None => (target, &b""[..]),
        };
        for part in &self.0 {
            match part {
                TemplatePart::Text(t) => out.extend_from_slice(t.as_bytes()),
                TemplatePart::Var(Variable::Scheme) => {
                    out.extend_from_slice(if https { b"https" } else { b"http" });
                }
                TemplatePart::Var(Variable::Host) => {
                    out.extend_from_slice(head.host().map(host_without_port).unwrap_or_default());
                }
                TemplatePart::Var(Variable::Uri) => out.extend_from_slice(target),
                TemplatePart::Var(Variable::Path) => out.extend_from_slice(path),
                TemplatePart::Var(Variable::Query) => out.extend_from_slice(query),
                TemplatePart::Var(Variable::IsArgs) if !query.is_empty() => out.push(b'?'),
                TemplatePart::Var(Variable::IsArgs) => {}
                TemplatePart::Var(Variable::ClientIp) => {
                    out.extend_from_slice(client.to_string().as_bytes())
                }
            }
        }
    }
}
