//! `[[listener.route]]` end to end: host and path routing to several upstreams, prefix
//! rewrites, redirects, fixed answers, and normalised matching, with real backends and raw
//! requests on loopback (raw, so that paths reach pinlb exactly as written).

use crate::common;

use common::*;

/// Two upstreams, `api` (backend "api") and `web` (backend "web"), and routes over them.
fn config(api: std::net::SocketAddr, web: std::net::SocketAddr) -> String {
    format!(
        r#"[runtime]
cpus = [{core}]

[[listener]]
address = "127.0.0.1:0"
upstream = "web"

[[listener.route]]
host = "admin.example.test"
respond = {{ status = 403, body = "admins only\n" }}

[[listener.route]]
host = ["www.example.test", "example.test"]
path_exact = "/old"
redirect = {{ status = 301, location = "{{scheme}}://{{host}}/new?from={{path}}" }}

[[listener.route]]
path = "/api/"
upstream = "api"
rewrite_prefix = "/v2/"

[[listener.route]]
path = "/private/"
respond = {{ status = 404, body = "not here\n" }}

[upstream.api]
backends = [{{ address = "{api}" }}]

[upstream.web]
backends = [{{ address = "{web}" }}]
"#,
        core = first_core()
    )
}

fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

#[tokio::test]
async fn hosts_and_paths_choose_the_upstream_and_a_prefix_is_rewritten() {
    let api = Backend::start("api").await;
    let web = Backend::start("web").await;
    let proxy = Proxy::start_toml(&config(api.addr, web.addr));

    let r = raw_request(
        proxy.addr,
        get("/api/users?id=7", "www.example.test").as_bytes(),
        false,
    )
    .await;
    assert_eq!(
        (r.status, r.header("x-backend")),
        (200, Some("api")),
        "{}",
        r.head
    );
    let r = raw_request(
        proxy.addr,
        get("/shop", "www.example.test").as_bytes(),
        false,
    )
    .await;
    assert_eq!(
        (r.status, r.header("x-backend")),
        (200, Some("web")),
        "{}",
        r.head
    );

    let seen: Vec<String> = api.requests().iter().map(|r| r.uri.clone()).collect();
    assert_eq!(
        seen,
        ["/v2/users?id=7"],
        "nginx's proxy_pass http://api/v2/; semantics"
    );
    // What no rewrite touches goes as received.
    let r = raw_request(proxy.addr, get("/a/./b//c", "x").as_bytes(), false).await;
    assert_eq!(r.status, 200);
    assert_eq!(web.requests().last().unwrap().uri, "/a/./b//c");
}

#[tokio::test]
async fn redirects_and_fixed_answers_come_from_pinlb() {
    let api = Backend::start("api").await;
    let web = Backend::start("web").await;
    let proxy = Proxy::start_toml(&config(api.addr, web.addr));

    let r = raw_request(
        proxy.addr,
        get("/old", "Example.test:8080").as_bytes(),
        false,
    )
    .await;
    assert_eq!(r.status, 301, "{}", r.head);
    assert_eq!(
        r.header("location"),
        Some("http://Example.test/new?from=/old")
    );

    let r = raw_request(
        proxy.addr,
        get("/anything", "admin.example.test").as_bytes(),
        false,
    )
    .await;
    assert_eq!(
        (r.status, r.body.as_slice()),
        (403, &b"admins only\n"[..]),
        "{}",
        r.head
    );
    // HEAD gets the length and no body.
    let r = raw_request(
        proxy.addr,
        b"HEAD /x HTTP/1.1\r\nHost: admin.example.test\r\n\r\n",
        true,
    )
    .await;
    assert_eq!((r.status, r.header("content-length")), (403, Some("12")));
    assert_eq!(api.hits() + web.hits(), 0, "no backend saw these");
}

#[tokio::test]
async fn a_host_with_its_root_dot_is_the_same_host_and_is_forwarded_as_received() {
    let api = Backend::start("api").await;
    let web = Backend::start("web").await;
    let proxy = Proxy::start_toml(&config(api.addr, web.addr));
    for host in [
        "admin.example.test.",
        "Admin.Example.Test.",
        "admin.example.test.:80",
        "admin.example.test.:8080",
    ] {
        let r = raw_request(proxy.addr, get("/anything", host).as_bytes(), false).await;
        assert_eq!(
            (r.status, r.body.as_slice()),
            (403, &b"admins only\n"[..]),
            "Host: {host}: {}",
            r.head
        );
    }
    let r = raw_request(
        proxy.addr,
        get("/old", "example.test.:8080").as_bytes(),
        false,
    )
    .await;
    assert_eq!(r.status, 301, "{}", r.head);
    // `{host}` is the Host as received, without its port.
    assert_eq!(
        r.header("location"),
        Some("http://example.test./new?from=/old")
    );
    assert_eq!(api.hits() + web.hits(), 0, "no backend saw these");
    // Only one root dot is stripped: two dots name no host, and go to the default upstream.
    let r = raw_request(
        proxy.addr,
        get("/x", "admin.example.test..").as_bytes(),
        false,
    )
    .await;
    assert_eq!((r.status, r.header("x-backend")), (200, Some("web")));
    // What is proxied carries the Host as the client sent it.
    let r = raw_request(
        proxy.addr,
        get("/shop", "WWW.example.test.:80").as_bytes(),
        false,
    )
    .await;
    assert_eq!((r.status, r.header("x-backend")), (200, Some("web")));
    let seen = web.requests();
    let hosts: Vec<_> = seen
        .iter()
        .map(|r| r.headers["host"].to_str().unwrap())
        .collect();
    assert_eq!(hosts, ["admin.example.test..", "WWW.example.test.:80"]);
}

#[tokio::test]
async fn a_route_host_written_with_its_root_dot_matches_the_name_without_it() {
    let web = Backend::start("web").await;
    let toml = format!(
        "[runtime]\ncpus = [{}]\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"web\"\n[[listener.route]]\nhost = [\"secret.example.test.\", \"*.wild.example.test.\"]\nrespond = {{ status = 403 }}\n[upstream.web]\nbackends = [{{ address = \"{}\" }}]\n",
        first_core(),
        web.addr
    );
    let proxy = Proxy::start_toml(&toml);
    for host in [
        "secret.example.test",
        "secret.example.test.",
        "a.wild.example.test",
        "a.wild.example.test.:80",
    ] {
        let r = raw_request(proxy.addr, get("/", host).as_bytes(), false).await;
        assert_eq!(r.status, 403, "Host: {host}: {}", r.head);
    }
    assert_eq!(web.hits(), 0);
}

#[tokio::test]
async fn dot_segments_escapes_and_double_slashes_cannot_reach_past_a_route() {
    let api = Backend::start("api").await;
    let web = Backend::start("web").await;
    let proxy = Proxy::start_toml(&config(api.addr, web.addr));
    for path in [
        "/private/key",
        "/public/../private/key",
        "/public/%2e%2e/private/key",
        "/public/%2E%2E/private/key",
        "//private/key",
        "/%70rivate/key",
        "/./private/./key",
    ] {
        let r = raw_request(proxy.addr, get(path, "x").as_bytes(), false).await;
        assert_eq!(
            (r.status, r.body.as_slice()),
            (404, &b"not here\n"[..]),
            "{path}: {}",
            r.head
        );
    }
    assert_eq!(web.hits(), 0);
}

#[tokio::test]
async fn without_a_default_upstream_an_unmatched_request_gets_404() {
    let api = Backend::start("api").await;
    let toml = format!(
        "[runtime]\ncpus = [{}]\n[[listener]]\naddress = \"127.0.0.1:0\"\n[[listener.route]]\npath = \"/api/\"\nupstream = \"api\"\n[upstream.api]\nbackends = [{{ address = \"{}\" }}]\n",
        first_core(),
        api.addr
    );
    let proxy = Proxy::start_toml(&toml);
    let r = raw_request(proxy.addr, get("/api/x", "h").as_bytes(), false).await;
    assert_eq!(r.status, 200);
    let r = raw_request(proxy.addr, get("/other", "h").as_bytes(), false).await;
    assert_eq!(r.status, 404, "{}", r.head);
    assert!(String::from_utf8_lossy(&r.body).contains("no route matches"));
}

#[tokio::test]
async fn a_route_sets_adds_and_removes_request_and_response_headers() {
    let api = Backend::start("api").await;
    let toml = format!(
        r#"[runtime]
cpus = [{core}]
[[listener]]
address = "127.0.0.1:0"
[[listener.route]]
path = "/"
upstream = "api"
request_headers = {{ set = {{ "X-Real-IP" = "{{client_ip}}", "X-Env" = "prod" }}, add = {{ "X-Route" = "{{scheme}}://{{host}}{{uri}}" }}, remove = ["X-Debug"] }}
response_headers = {{ add = {{ "X-Served-By" = "pinlb" }}, remove = ["X-Backend"] }}
[upstream.api]
backends = [{{ address = "{api}" }}]
"#,
        core = first_core(),
        api = api.addr
    );
    let proxy = Proxy::start_toml(&toml);
    let r = raw_request(
        proxy.addr,
        b"GET /p?q=1 HTTP/1.1\r\nHost: h.test\r\nX-Debug: 1\r\nX-Env: dev\r\nX-Env: test\r\nX-Keep: k\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("x-backend"), None, "removed: {}", r.head);
    assert_eq!(r.header("x-served-by"), Some("pinlb"));
    let seen = api.requests();
    let h = &seen[0].headers;
    let all = |name: &str| {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(all("x-real-ip"), ["127.0.0.1"]);
    assert_eq!(
        all("x-env"),
        ["prod"],
        "set replaces every line of its name"
    );
    assert_eq!(all("x-route"), ["http://h.test/p?q=1"]);
    assert_eq!(all("x-debug"), Vec::<String>::new());
    assert_eq!(all("x-keep"), ["k"]);
}

/// A listener's header rules apply to its requests that no route with its own takes (the
/// default upstream's included, and with no route at all); a route's own replace them whole,
/// as nginx's `location` with a `proxy_set_header` of its own inherits none of its `server`'s;
/// `response_headers` are on refusals too (as nginx's `add_header … always`).
#[tokio::test]
async fn a_listeners_header_rules_apply_unless_a_route_has_its_own() {
    let api = Backend::start("api").await;
    let toml = format!(
        r#"[runtime]
cpus = [{core}]
[[listener]]
address = "127.0.0.1:0"
upstream = "api"
request_headers = {{ set = {{ "X-Env" = "prod" }} }}
response_headers = {{ add = {{ "Strict-Transport-Security" = "max-age=60" }} }}
[[listener.route]]
path = "/own/"
upstream = "api"
request_headers = {{ add = {{ "X-Own" = "yes" }} }}
response_headers = {{}}
[[listener.route]]
path = "/closed/"
upstream = "api"
access = ["deny all"]
[upstream.api]
backends = [{{ address = "{api}" }}]
"#,
        core = first_core(),
        api = api.addr
    );
    let proxy = Proxy::start_toml(&toml);
    let get = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: h.test\r\nX-Env: dev\r\n\r\n").into_bytes()
    };
    let r = raw_request(proxy.addr, &get("/elsewhere"), false).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(r.header("strict-transport-security"), Some("max-age=60"));
    let r = raw_request(proxy.addr, &get("/own/x"), false).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert_eq!(
        r.header("strict-transport-security"),
        None,
        "lifted: {}",
        r.head
    );
    let r = raw_request(proxy.addr, &get("/closed/x"), false).await;
    assert_eq!(r.status, 403, "{}", r.head);
    assert_eq!(r.header("strict-transport-security"), Some("max-age=60"));
    let seen = api.requests();
    assert_eq!(seen.len(), 2, "the refused request reached no backend");
    let values = |i: usize, name: &str| {
        (seen[i].headers.get_all(name).iter())
            .map(|v| v.to_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(values(0, "x-env"), ["prod"], "the listener's rules");
    assert_eq!(values(0, "x-own"), Vec::<String>::new());
    assert_eq!(
        values(1, "x-env"),
        ["dev"],
        "the route's own replace them whole"
    );
    assert_eq!(values(1, "x-own"), ["yes"]);
}

/// A listener without routes edits its requests' lines too: the plain path's shortcut
/// (no route to look for) is not taken then.
#[tokio::test]
async fn a_listener_without_routes_applies_its_request_headers() {
    let api = Backend::start("api").await;
    let toml = format!(
        "[runtime]\ncpus = [{core}]\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"api\"\n\
         request_headers = {{ set = {{ \"X-Env\" = \"prod\" }} }}\n\
         [upstream.api]\nbackends = [{{ address = \"{api}\" }}]\n",
        core = first_core(),
        api = api.addr
    );
    let proxy = Proxy::start_toml(&toml);
    let get = b"GET / HTTP/1.1\r\nHost: h.test\r\nX-Env: dev\r\n\r\n";
    let r = raw_request(proxy.addr, get, false).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let seen = api.requests();
    let env: Vec<_> = seen[0].headers.get_all("x-env").iter().collect();
    assert_eq!(env, ["prod"]);
}

#[test]
fn a_route_can_not_change_the_headers_pinlb_writes() {
    let toml = "[[listener]]\naddress = \"127.0.0.1:0\"\n[[listener.route]]\nupstream = \"a\"\nrequest_headers = { set = { \"Content-Length\" = \"1\" } }\n[upstream.a]\nbackends = [{ address = \"127.0.0.1:9001\" }]\n";
    let e = pinlb::Config::parse("t.toml", toml, &[0])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("t.toml:5:48: listener[0].route[0].request_headers.set: \"Content-Length\" is written by pinlb itself"),
        "{e}"
    );
}

#[tokio::test]
async fn a_route_may_shorten_its_upstreams_response_timeout() {
    let slow = Backend::start_with_delay("slow", std::time::Duration::from_millis(600)).await;
    let toml = format!(
        r#"[runtime]
cpus = [{core}]
[[listener]]
address = "127.0.0.1:0"
upstream = "app"
[[listener.route]]
path = "/quick/"
upstream = "app"
timeouts = {{ response = "150ms" }}
[upstream.app]
backends = [{{ address = "{slow}" }}]
"#,
        core = first_core(),
        slow = slow.addr
    );
    let proxy = Proxy::start_toml(&toml);
    let started = std::time::Instant::now();
    let r = raw_request(proxy.addr, get("/quick/x", "h").as_bytes(), false).await;
    assert_eq!(r.status, 504, "{}", r.head);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
    // Elsewhere the upstream's own timeout (60 s) lets the slow answer through.
    let r = raw_request(proxy.addr, get("/other", "h").as_bytes(), false).await;
    assert_eq!(r.status, 200, "{}", r.head);
}
