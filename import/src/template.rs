//! nginx variables (`$host`, `$request_uri`, ...) as pinlb's template variables (`{host}`,
//! `{uri}`, ...), for header values and redirect locations.

/// nginx variables in a value as pinlb template variables; `None` for one with no equivalent.
pub fn template(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i].replace('{', "{{").replace('}', "}}"));
        let tail = &rest[i + 1..];
        let tail = tail.strip_prefix('{').unwrap_or(tail);
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let var = match &tail[..end] {
            "host" => "{host}",
            "remote_addr" => "{client_ip}",
            "scheme" => "{scheme}",
            "request_uri" => "{uri}",
            "uri" | "document_uri" => "{path}",
            "args" | "query_string" => "{query}",
            _ => return None,
        };
        out.push_str(var);
        rest = tail[end..].strip_prefix('}').unwrap_or(&tail[end..]);
    }
    out.push_str(&rest.replace('{', "{{").replace('}', "}}"));
    Some(out)
}
