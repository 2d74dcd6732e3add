//! nginx's Unix-socket upstreams: `server unix:/path;` in an `upstream {}` block and
//! `proxy_pass http://unix:/path:/uri;`, as pinlb's `address = "unix:/path"`.
//!
//! nginx ends the socket's path at the first `:` after `unix:` in a `proxy_pass` URL, and what
//! follows is the URI part (`http://unix:/run/app.sock:/api/`); without a `:` the whole rest is
//! the path. A relative path is refused as pinlb refuses it: nginx would take it relative to
//! its working directory, which pinlb cannot know.

/// A `server unix:/path` address as pinlb writes it; why not, for a path pinlb cannot take.
pub fn server_address(address: &str) -> Result<String, String> {
    let path = address.strip_prefix("unix:").unwrap_or(address);
    check(path)?;
    Ok(format!("unix:{path}"))
}

/// `proxy_pass http://unix:/path[:/uri]`'s part after `http://unix:`: the backend's address
/// (`unix:/path`, which names the upstream made for it) and the URI part, if any.
pub fn proxy_target(rest: &str) -> Option<(String, Option<String>)> {
    let (path, uri) = match rest.split_once(':') {
        Some((path, "")) => (path, None),
        Some((path, uri)) if uri.starts_with('/') => (path, Some(uri.to_string())),
        Some(_) => return None,
        None => (rest, None),
    };
    check(path).ok()?;
    Some((format!("unix:{path}"), uri))
}

fn check(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!(
            "the socket path {path:?} is relative; pinlb takes absolute paths only"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_socket_converts_and_a_relative_one_is_refused() {
        assert_eq!(
            server_address("unix:/run/app.sock").unwrap(),
            "unix:/run/app.sock"
        );
        assert!(
            server_address("unix:app.sock")
                .unwrap_err()
                .contains("relative")
        );
    }

    #[test]
    fn a_proxy_pass_url_splits_at_the_colon_after_the_path() {
        assert_eq!(
            proxy_target("/run/app.sock:/api/"),
            Some(("unix:/run/app.sock".into(), Some("/api/".into())))
        );
        assert_eq!(
            proxy_target("/run/app.sock:"),
            Some(("unix:/run/app.sock".into(), None))
        );
        assert_eq!(
            proxy_target("/run/app.sock"),
            Some(("unix:/run/app.sock".into(), None))
        );
        assert_eq!(proxy_target("run/app.sock:/"), None);
    }
}
