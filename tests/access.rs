//! allow/deny, basic auth and `satisfy`, end to end with curl: the client's own source
//! address (`--interface`, all of 127/8 is loopback), htpasswd files made at test time with
//! `htpasswd` and `openssl passwd`, HTTP/1.1 and h2c, a reload that changes the file, the
//! metrics, and `pinlb check` on a bad htpasswd line.

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use common::*;
use http::Method;
use sha1::{Digest, Sha1};

/// A fresh path under cargo's scratch directory.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "pinlb-access-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ))
}

/// Runs `cmd` on a blocking thread; its stdout, which it must succeed to give.
async fn run(mut cmd: Command) -> String {
    let what = format!("{cmd:?}");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run the tool"))
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What curl got: the status, the header block, the body.
#[derive(Debug)]
struct Curl {
    status: u16,
    headers: String,
    body: String,
}

/// `curl ARGS URL`.
async fn curl(url: &str, args: &[&str]) -> Curl {
    let (head, body) = (scratch("head"), scratch("body"));
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-D"])
        .arg(&head)
        .arg("-o")
        .arg(&body)
        .args(["-w", "%{http_code}"])
        .args(args)
        .arg(url);
    let status = run(cmd).await.trim().parse().expect("a status");
    let c = Curl {
        status,
        headers: std::fs::read_to_string(&head).unwrap_or_default(),
        body: std::fs::read_to_string(&body).unwrap_or_default(),
    };
    let _ = (std::fs::remove_file(head), std::fs::remove_file(body));
    c
}

/// `user:hash` of `password`, made by the tool of each format.
async fn hash_line(format: &str, user: &str, password: &str) -> String {
    let tool = |prog: &str, args: &[&str]| {
        let mut c = Command::new(prog);
        c.args(args);
        c
    };
    let line = match format {
        "bcrypt" => run(tool("htpasswd", &["-nbB", "-C", "5", user, password])).await,
        "apr1" => run(tool("htpasswd", &["-nbm", user, password])).await,
        "sha" => run(tool("htpasswd", &["-nbs", user, password])).await,
        "1" | "5" | "6" => {
            let flag = format!("-{format}");
            let hash = run(tool("openssl", &["passwd", &flag, password])).await;
            format!("{user}:{hash}")
        }
        "ssha" => {
            let salt = b"pinch of";
            let mut d = Sha1::new()
                .chain_update(password)
                .chain_update(salt)
                .finalize()
                .to_vec();
            d.extend_from_slice(salt);
            let b64 = base64::engine::general_purpose::STANDARD.encode(d);
            format!("{user}:{{SSHA}}{b64}")
        }
        "plain" => format!("{user}:{{PLAIN}}{password}"),
        other => panic!("no format {other}"),
    };
    line.trim_end().to_string()
}

/// An htpasswd file of `lines`.
fn htpasswd(lines: &[String]) -> PathBuf {
    let path = scratch("htpasswd");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

fn with(backend: &Backend, listener_keys: &str) -> Setup {
    let mut setup = Setup::with(&[backend.addr]);
    setup.listener_keys = listener_keys.to_string();
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n".into();
    setup
}

fn refused(m: &Metrics, proxy: &Proxy, cause: &str) -> f64 {
    m.value(
        "pinlb_refused_total",
        &format!("listener=\"{}\",cause=\"{cause}\"", proxy.addr),
    )
}

#[tokio::test]
async fn access_rules_let_in_and_deny_by_the_first_match_on_the_source_address() {
    let backend = Backend::start("b").await;
    let keys = r#"access = ["deny 127.0.0.3", "allow 127.0.0.0/29", "deny all"]"#;
    let proxy = Proxy::start(&with(&backend, keys));
    let url = format!("http://{}/", proxy.addr);
    assert_eq!(curl(&url, &["--interface", "127.0.0.1"]).await.status, 200);
    assert_eq!(curl(&url, &["--interface", "127.0.0.2"]).await.status, 200);
    let denied = curl(&url, &["--interface", "127.0.0.3"]).await;
    assert_eq!(denied.status, 403, "the first match wins over the range");
    assert!(denied.body.contains("403 Forbidden"), "{}", denied.body);
    assert_eq!(curl(&url, &["--interface", "127.0.0.9"]).await.status, 403);
    assert_eq!(backend.hits(), 2, "nothing denied reached the backend");
    let m = proxy.metrics().await;
    assert_eq!(refused(&m, &proxy, "denied"), 2.0);
    assert_eq!(refused(&m, &proxy, "unauthorized"), 0.0);
}

#[tokio::test]
async fn a_list_without_deny_all_lets_the_rest_in_and_a_route_replaces_the_listeners() {
    let backend = Backend::start("b").await;
    let keys = r#"access = ["deny 127.0.0.2"]
[[listener.route]]
path = "/open/"
upstream = "app"
access = []
[[listener.route]]
path = "/strict/"
upstream = "app"
access = ["allow 127.0.0.2", "deny all"]
"#;
    let proxy = Proxy::start(&with(&backend, keys));
    let at = |p: &str| format!("http://{}{p}", proxy.addr);
    let from = |ip: &'static str| ["--interface", ip];
    assert_eq!(curl(&at("/"), &from("127.0.0.1")).await.status, 200);
    assert_eq!(curl(&at("/"), &from("127.0.0.2")).await.status, 403);
    assert_eq!(curl(&at("/open/x"), &from("127.0.0.2")).await.status, 200);
    assert_eq!(curl(&at("/strict/x"), &from("127.0.0.2")).await.status, 200);
    assert_eq!(curl(&at("/strict/x"), &from("127.0.0.1")).await.status, 403);
}

#[tokio::test]
async fn ipv6_loopback_is_matched_by_ipv6_rules() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no ::1 on this machine; the IPv6 rules are unit-tested in modules::access");
        return;
    }
    let backend = Backend::start("b").await;
    let mut setup = with(&backend, "");
    setup.extra = String::new();
    let toml = setup.toml().replacen(
        "address = \"127.0.0.1:0\"",
        "address = \"[::1]:0\"\naccess = [\"allow ::1/128\", \"deny all\"]",
        1,
    );
    let proxy = Proxy::start_toml(&toml);
    let url = format!("http://{}/", proxy.addr);
    assert_eq!(curl(&url, &[]).await.status, 200);
    let toml = toml.replace("allow ::1/128", "deny ::1");
    let proxy = Proxy::start_toml(&toml);
    let url = format!("http://{}/", proxy.addr);
    assert_eq!(curl(&url, &[]).await.status, 403);
}

#[tokio::test]
async fn basic_auth_takes_each_htpasswd_format_and_passes_the_header_on() {
    let formats = ["bcrypt", "apr1", "sha", "ssha", "1", "5", "6", "plain"];
    let mut lines = Vec::new();
    for f in formats {
        lines.push(hash_line(f, &format!("u{f}"), &format!("pw-{f}")).await);
    }
    let file = htpasswd(&lines);
    let backend = Backend::start("b").await;
    let keys = format!(
        "auth_basic = {{ realm = \"Staff only\", user_file = \"{}\" }}",
        file.display()
    );
    let proxy = Proxy::start(&with(&backend, &keys));
    let url = format!("http://{}/", proxy.addr);
    for f in formats {
        let good = format!("u{f}:pw-{f}");
        let c = curl(&url, &["-u", &good]).await;
        assert_eq!(c.status, 200, "{f}: {c:?}");
        // Twice: the second from the cache.
        assert_eq!(curl(&url, &["-u", &good]).await.status, 200, "{f}");
        let wrong = format!("u{f}:pw-{f}x");
        assert_eq!(curl(&url, &["-u", &wrong]).await.status, 401, "{f}");
    }
    let seen = backend.requests();
    let sent = base64::engine::general_purpose::STANDARD.encode("ubcrypt:pw-bcrypt");
    assert_eq!(
        seen[0].headers["authorization"],
        format!("Basic {sent}"),
        "the Authorization header goes on to the backend, as nginx passes it"
    );
    assert_eq!(backend.hits(), 2 * formats.len());
    let m = proxy.metrics().await;
    assert_eq!(refused(&m, &proxy, "unauthorized"), formats.len() as f64);
}

#[tokio::test]
async fn missing_malformed_and_wrong_credentials_get_401_with_the_challenge() {
    let file = htpasswd(&[hash_line("apr1", "ann", "secret").await]);
    let backend = Backend::start("b").await;
    let keys = format!(
        "auth_basic = {{ realm = \"Restricted\", user_file = \"{}\" }}",
        file.display()
    );
    let proxy = Proxy::start(&with(&backend, &keys));
    let url = format!("http://{}/", proxy.addr);
    let no_colon = format!(
        "Authorization: Basic {}",
        base64::engine::general_purpose::STANDARD.encode("annsecret")
    );
    let cases: [&[&str]; 6] = [
        &[],
        &["-u", "ann:wrong"],
        &["-u", "bob:secret"],
        &["-H", "Authorization: Basic !!!not-base64"],
        &["-H", &no_colon],
        &["-H", "Authorization: Bearer abc"],
    ];
    for args in cases {
        let c = curl(&url, args).await;
        assert_eq!(c.status, 401, "{args:?}");
        assert!(
            c.headers
                .to_ascii_lowercase()
                .contains("www-authenticate: basic realm=\"restricted\", charset=\"utf-8\"\r\n"),
            "{args:?}: {}",
            c.headers
        );
        assert!(c.body.starts_with("401 Unauthorized"), "{}", c.body);
    }
    assert_eq!(curl(&url, &["-u", "ann:secret"]).await.status, 200);
    assert_eq!(backend.hits(), 1);
    let m = proxy.metrics().await;
    assert_eq!(refused(&m, &proxy, "unauthorized"), cases.len() as f64);
}

#[tokio::test]
async fn a_route_with_auth_basic_off_lifts_the_listeners() {
    let file = htpasswd(&[hash_line("plain", "ann", "secret").await]);
    let backend = Backend::start("b").await;
    let keys = format!(
        "auth_basic = {{ realm = \"R\", user_file = \"{}\" }}\n[[listener.route]]\npath = \"/public/\"\nupstream = \"app\"\nauth_basic = \"off\"\n",
        file.display()
    );
    let proxy = Proxy::start(&with(&backend, &keys));
    let at = |p: &str| format!("http://{}{p}", proxy.addr);
    assert_eq!(curl(&at("/public/a"), &[]).await.status, 200);
    assert_eq!(curl(&at("/private"), &[]).await.status, 401);
    assert_eq!(
        curl(&at("/private"), &["-u", "ann:secret"]).await.status,
        200
    );
}

#[tokio::test]
async fn satisfy_any_lets_in_either_and_all_needs_both() {
    let file = htpasswd(&[hash_line("sha", "ann", "secret").await]);
    let backend = Backend::start("b").await;
    let auth = format!(
        "auth_basic = {{ realm = \"R\", user_file = \"{}\" }}",
        file.display()
    );
    let access = r#"access = ["allow 127.0.0.1", "deny all"]"#;
    let from = |ip: &'static str| vec!["--interface", ip];
    for satisfy in ["all", "any"] {
        let keys = format!("{access}\n{auth}\nsatisfy = \"{satisfy}\"\n");
        let proxy = Proxy::start(&with(&backend, &keys));
        let url = format!("http://{}/", proxy.addr);
        let good = |ip| [from(ip), vec!["-u", "ann:secret"]].concat();
        let allowed_no_auth = curl(&url, &from("127.0.0.1")).await.status;
        let allowed_auth = curl(&url, &good("127.0.0.1")).await.status;
        let denied_auth = curl(&url, &good("127.0.0.2")).await.status;
        let denied_no_auth = curl(&url, &from("127.0.0.2")).await.status;
        let got = [allowed_no_auth, allowed_auth, denied_auth, denied_no_auth];
        match satisfy {
            "all" => assert_eq!(got, [401, 200, 403, 403], "satisfy all"),
            _ => assert_eq!(got, [200, 200, 200, 401], "satisfy any"),
        }
    }
}

#[tokio::test]
async fn http2_clients_are_checked_the_same() {
    let file = htpasswd(&[hash_line("6", "ann", "secret").await]);
    let backend = Backend::start("b").await;
    let keys = format!(
        "h2c = true\naccess = [\"deny 127.0.0.2\"]\nauth_basic = {{ realm = \"R\", user_file = \"{}\" }}",
        file.display()
    );
    let proxy = Proxy::start(&with(&backend, &keys));
    let url = format!("http://{}/", proxy.addr);
    let h2 = "--http2-prior-knowledge";
    let c = curl(&url, &[h2]).await;
    assert_eq!(c.status, 401);
    assert!(c.headers.starts_with("HTTP/2"), "{}", c.headers);
    assert!(
        c.headers.contains("www-authenticate: Basic realm=\"R\""),
        "{}",
        c.headers
    );
    assert_eq!(curl(&url, &[h2, "-u", "ann:secret"]).await.status, 200);
    let denied = curl(&url, &[h2, "-u", "ann:secret", "--interface", "127.0.0.2"]).await;
    assert_eq!(denied.status, 403);
    assert_eq!(backend.requests()[0].version, http::Version::HTTP_11);
}

#[tokio::test]
async fn a_reload_reads_the_htpasswd_file_again() {
    let backend = Backend::start("b").await;
    // Relative to the configuration file's directory.
    let file = scratch("reload-htpasswd");
    std::fs::write(&file, hash_line("apr1", "ann", "old").await + "\n").unwrap();
    let name = file.file_name().unwrap().to_str().unwrap();
    let keys = format!("auth_basic = {{ realm = \"R\", user_file = \"{name}\" }}");
    let toml = with(&backend, &keys).toml();
    let proxy = Proxy::start_file(&toml);
    let url = format!("http://{}/", proxy.addr);
    assert_eq!(curl(&url, &["-u", "ann:old"]).await.status, 200);
    std::fs::write(&file, hash_line("bcrypt", "ann", "new").await + "\n").unwrap();
    assert_eq!(
        curl(&url, &["-u", "ann:old"]).await.status,
        200,
        "the file is read at load and reload only"
    );
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("access, auth_basic or satisfy changed"),
        "the reload says so: {}",
        r.body
    );
    assert_eq!(curl(&url, &["-u", "ann:old"]).await.status, 401);
    assert_eq!(curl(&url, &["-u", "ann:new"]).await.status, 200);
    // A bad file keeps the running generation.
    std::fs::write(&file, "ann:abJnggxhB/yWI\n").unwrap();
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("DES crypt"), "{}", r.body);
    assert_eq!(curl(&url, &["-u", "ann:new"]).await.status, 200);
}

#[tokio::test]
async fn refusals_are_logged_once_per_client_per_second_naming_client_and_user() {
    let file = htpasswd(&[hash_line("plain", "ann", "secret").await]);
    let backend = Backend::start("b").await;
    let keys = format!(
        "access = [\"deny 127.0.0.2\"]\nauth_basic = {{ realm = \"R\", user_file = \"{}\" }}",
        file.display()
    );
    let mut setup = with(&backend, &keys);
    setup.extra = String::new();
    let mut proxy = BinProxy::spawn(&setup).await;
    let url = format!("http://{}/", proxy.addr);
    for _ in 0..5 {
        assert_eq!(curl(&url, &["-u", "ann:hunter2"]).await.status, 401);
    }
    assert_eq!(curl(&url, &["--interface", "127.0.0.2"]).await.status, 403);
    let line = proxy
        .wait_for_log("answered 403 to 127.0.0.2: denied by access rules")
        .await;
    assert!(line.contains("WARN"), "{line}");
    let needle = "answered 401 to 127.0.0.1: basic auth: wrong password for user \"ann\"";
    proxy.wait_for_log(needle).await;
    let log = proxy.log();
    let times = log.iter().filter(|l| l.contains(needle)).count();
    assert!(
        (1..=2).contains(&times),
        "once a second, not once a request: {times}\n{}",
        log.join("\n")
    );
    assert!(
        !log.iter().any(|l| l.contains("hunter2")),
        "never the password"
    );
}

#[test]
fn check_names_bad_rules_and_htpasswd_lines_and_describes_a_valid_file() {
    let file = htpasswd(&["ann:{PLAIN}x".into(), "bob:abJnggxhB/yWI".into()]);
    let toml = format!(
        "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\nauth_basic = {{ realm = \"R\", user_file = \"{}\" }}\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:1\" }}]\n",
        file.display()
    );
    let config = temp_config(&toml);
    let check = |config: &PathBuf| {
        let out = Command::new(bin())
            .args(["check", "-c"])
            .arg(config)
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).trim_end().to_string()
    };
    let col = toml.lines().nth(3).unwrap().find("user_file = ").unwrap() + 13;
    assert_eq!(
        check(&config),
        format!(
            "{}:4:{col}: listener[0].auth_basic.user_file: {}:2: DES crypt is not taken: it reads only a password's first 8 characters; make it again with htpasswd -B (bcrypt) or openssl passwd -6",
            config.display(),
            file.display()
        )
    );
    // Valid, `pinlb check` says what applies.
    let good = htpasswd(&["ann:{PLAIN}x".into()]);
    let valid = temp_config(
        &toml
            .replace(file.to_str().unwrap(), good.to_str().unwrap())
            .replace(
                "auth_basic =",
                "access = [\"deny 10.0.0.1\", \"allow all\"]\nsatisfy = \"any\"\nauth_basic =",
            ),
    );
    let out = Command::new(bin())
        .args(["check", "-c"])
        .arg(&valid)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!(
            "  access: 2 rule(s), first deny 10.0.0.1/32; auth_basic \"R\": 1 user(s) from {}; satisfy any\n",
            good.display()
        )),
        "{said}"
    );
    let missing = temp_config(&toml.replace(file.to_str().unwrap(), "/nonexistent/htpasswd"));
    let e = check(&missing);
    assert!(
        e.ends_with("listener[0].auth_basic.user_file: cannot read /nonexistent/htpasswd: No such file or directory (os error 2)"),
        "{e}"
    );
    let base = "[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n";
    let up = "[upstream.app]\nbackends = [{ address = \"127.0.0.1:1\" }]\n";
    for (line, key, wanted) in [
        (
            r#"access = ["allow 10.0.0.0/8", "permit 1.2.3.4"]"#,
            "listener[0].access[1]",
            "\"permit 1.2.3.4\": expected",
        ),
        (
            r#"access = ["allow 10.1.1.0/16"]"#,
            "listener[0].access[0]",
            "expected 10.1.0.0/16",
        ),
        (
            r#"satisfy = "either""#,
            "listener[0].satisfy",
            "expected \"all\" or \"any\"",
        ),
        (
            r#"auth_basic = "on""#,
            "listener[0].auth_basic",
            "expected { realm",
        ),
        (
            r#"auth_basic = { user_file = "h" }"#,
            "listener[0].auth_basic.realm",
            "missing",
        ),
    ] {
        let e = check(&temp_config(&format!("{base}{line}\n{up}")));
        assert!(e.contains(":4:"), "{line}: {e}");
        assert!(e.contains(&format!(" {key}: ")), "{line}: {e}");
        assert!(e.contains(wanted), "{line}: {e}");
    }
}
