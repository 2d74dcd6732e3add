//! `Config::parse` end to end: what each section accepts, its defaults, and each error's exact
//! place and words.

use super::*;

const ALLOWED: &[usize] = &[0, 1, 2, 3];

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse("pinlb.toml", text, ALLOWED)
}

fn err(text: &str) -> String {
    parse(text)
        .expect_err("config should be rejected")
        .to_string()
}

const MINIMAL: &str = r#"
[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:8881" }]
"#;

#[test]
fn admin_is_off_unless_configured_and_needs_a_token_off_loopback() {
    assert_eq!(parse(MINIMAL).unwrap().admin, None);
    let on = parse(&format!("{MINIMAL}[admin]\n")).unwrap();
    assert_eq!(
        on.admin.unwrap().address,
        Admin::DEFAULT_ADDRESS.parse().unwrap()
    );
    assert_eq!(
        err(&format!("{MINIMAL}[admin]\naddress = \"0.0.0.0:9901\"\n")),
        "pinlb.toml:9:11: admin.address: 0.0.0.0:9901 is not a loopback address, so admin.token or admin.token_file must be set: anyone who can reach it could take backends out and reload the config"
    );
    let open = parse(&format!(
        "{MINIMAL}[admin]\naddress = \"0.0.0.0:9901\"\ntoken = \"t\"\n"
    ))
    .unwrap();
    assert_eq!(open.admin.unwrap().token.as_deref(), Some("t"));
    assert_eq!(
        err(&format!("{MINIMAL}[admin]\naddress = \"localhost\"\n")),
        "pinlb.toml:9:11: admin.address: invalid address \"localhost\", expected IP:PORT such as \"127.0.0.1:9901\""
    );
    assert!(err(&format!("{MINIMAL}[admin]\nport = 1\n")).contains("unknown field `port`"));
    assert_eq!(
        err(&format!("{MINIMAL}[admin]\naddress = \"127.0.0.1:8888\"\n")),
        "pinlb.toml:9:11: admin.address: 127.0.0.1:8888 is also a [[listener]] address, expected an address of its own"
    );
    assert!(
        err(&format!("{MINIMAL}[admin]\ntoken = \"two words\"\n"))
            .starts_with("pinlb.toml:9:9: admin.token: expected a non-empty secret")
    );
}

#[test]
fn admin_token_file_is_read_without_its_trailing_newline() {
    let path = std::env::temp_dir().join(format!("pinlb-token-{}", std::process::id()));
    let with = |file: &str| {
        format!("{MINIMAL}[admin]\naddress = \"0.0.0.0:9901\"\ntoken_file = \"{file}\"\n")
    };
    std::fs::write(&path, "s3cret\n").unwrap();
    let file = path.to_str().unwrap();
    let admin = parse(&with(file)).unwrap().admin.unwrap();
    assert_eq!(admin.token.as_deref(), Some("s3cret"));
    assert_eq!(
        err(&format!("{}token = \"t\"\n", with(file))),
        "pinlb.toml:10:14: admin.token_file: set together with admin.token, expected one of them"
    );
    std::fs::write(&path, "two words\n").unwrap();
    assert!(
        err(&with(file))
            .starts_with("pinlb.toml:10:14: admin.token_file: expected a non-empty secret"),
    );
    std::fs::remove_file(&path).unwrap();
    assert!(err(&with(file)).starts_with(&format!(
        "pinlb.toml:10:14: admin.token_file: cannot read {file}: "
    )));
}

#[test]
fn the_access_log_is_off_by_default_and_its_format_is_checked() {
    assert_eq!(parse(MINIMAL).unwrap().access_log, None);
    let log = parse(&format!("{MINIMAL}[log]\naccess = \"stdout\"\n"))
        .unwrap()
        .access_log
        .unwrap();
    assert_eq!(
        (log.target, log.format),
        (AccessTarget::Stdout, AccessFormat::Combined)
    );
    assert_eq!(
        err(&format!(
            "{MINIMAL}[log]\naccess = \"/tmp/a.log\"\nformat = \"jsonl\"\n"
        )),
        "pinlb.toml:10:10: log.format: unknown value \"jsonl\", expected combined, json, or a template with fields such as '{remote_addr} {status} {request_time}'"
    );
    assert_eq!(
        err(&format!("{MINIMAL}[log]\nformat = \"json\"\n")),
        "pinlb.toml:9:10: log.format: set without log.access, expected log.access too (\"stdout\" or a file path)"
    );
}

#[test]
fn a_log_template_is_parsed_and_an_unknown_field_is_pointed_at() {
    let log = parse(&format!(
        "{MINIMAL}[log]\naccess = \"stdout\"\nformat = '{{remote_addr}} {{status}}'\n"
    ))
    .unwrap()
    .access_log
    .unwrap();
    assert!(matches!(log.format, AccessFormat::Template(_)));
    let e = err(&format!(
        "{MINIMAL}[log]\naccess = \"stdout\"\nformat = '{{status}} {{upstream_tim}}'\n"
    ));
    // The column of the unknown field itself.
    assert!(
        e.starts_with("pinlb.toml:10:20: log.format: unknown field {upstream_tim}, expected one of remote_addr"),
        "{e}"
    );
}

#[test]
fn request_ids_follow_the_access_log_unless_told() {
    assert_eq!(parse(MINIMAL).unwrap().request_ids, None);
    let logged = format!("{MINIMAL}[log]\naccess = \"stdout\"\n");
    let ids = parse(&logged).unwrap().request_ids.unwrap();
    assert_eq!(
        (ids.header.as_str(), ids.traceparent),
        ("x-request-id", false)
    );
    let off = format!("{logged}[request_id]\nenabled = false\n");
    assert_eq!(parse(&off).unwrap().request_ids, None);
    let on =
        format!("{MINIMAL}[request_id]\nenabled = true\nheader = \"X-Req\"\ntraceparent = true\n");
    let ids = parse(&on).unwrap().request_ids.unwrap();
    assert_eq!((ids.header.as_str(), ids.traceparent), ("x-req", true));
    assert_eq!(
        err(&format!("{MINIMAL}[request_id]\nheader = \"bad name\"\n")),
        "pinlb.toml:9:10: request_id.header: \"bad name\" is not a header name, expected one such as X-Request-ID"
    );
}

#[test]
fn minimal_config_takes_defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.runtime.cpus, ALLOWED);
    assert_eq!(c.runtime.shutdown_timeout, Duration::from_secs(30));
    let u = &c.upstreams[0];
    assert_eq!(u.algorithm, Algorithm::RoundRobin);
    assert_eq!(u.keepalive, 64);
    assert_eq!(u.backends[0].weight, 1);
    assert_eq!(u.timeouts, Timeouts::default());
    assert_eq!(c.listeners[0].upstream, 0);
    assert_eq!(c.limits, Limits::default());
}

#[test]
fn limits_parse_sizes_and_durations() {
    let c = parse(&format!(
        "[limits]\nmax_header_bytes = \"16KiB\"\nmax_headers = 50\nmax_uri_bytes = 2048\nmax_body = \"1MiB\"\nheader_timeout = \"300ms\"\nbody_timeout = \"2s\"\nmax_connections = 2\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        c.limits,
        Limits {
            max_header_bytes: 16 * 1024,
            max_headers: 50,
            max_uri_bytes: 2048,
            max_body: 1024 * 1024,
            header_timeout: Duration::from_millis(300),
            body_timeout: Duration::from_secs(2),
            max_connections: 2,
            max_connections_given: true,
        }
    );
}

#[test]
fn limits_that_could_never_work_are_rejected_at_their_place() {
    let with = |kv: &str| err(&format!("[limits]\n{kv}\n{MINIMAL}"));
    assert_eq!(
        with("max_header_bytes = \"100B\""),
        "pinlb.toml:2:20: limits.max_header_bytes: 100 bytes is out of range, expected \"1KiB\" to \"64KiB\""
    );
    assert!(
        with("max_header_bytes = \"65KiB\"")
            .starts_with("pinlb.toml:2:20: limits.max_header_bytes: 66560 bytes is out of range"),
        "{}",
        with("max_header_bytes = \"65KiB\"")
    );
    assert_eq!(
        with("max_headers = 0"),
        "pinlb.toml:2:15: limits.max_headers: 0 is out of range, expected 1 to 1000"
    );
    assert_eq!(
        with("max_uri_bytes = \"0\""),
        "pinlb.toml:2:17: limits.max_uri_bytes: 0 is not allowed, expected a size such as \"8KiB\""
    );
    assert!(
        with("header_timeout = \"0s\"")
            .starts_with("pinlb.toml:2:18: limits.header_timeout: a duration of 0"),
        "{}",
        with("header_timeout = \"0s\"")
    );
    assert!(
        with("max_body = \"lots\"")
            .starts_with("pinlb.toml:2:12: limits.max_body: invalid size \"lots\""),
        "{}",
        with("max_body = \"lots\"")
    );
}

#[test]
fn full_contract_parses() {
    let c = parse(
        r#"
[runtime]
cpus = [0, "2-3"]
shutdown_timeout = "250ms"

[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
algorithm = "least_conn"
keepalive = 8
backends = [
  { address = "127.0.0.1:8881", weight = 5 },
  { address = "127.0.0.1:8882", cpus = [1] },
  { address = "127.0.0.1:8883", cpus = "2" },
]

[upstream.app.timeouts]
connect = "1s"
response = "1m"
send = "5s"
client_idle = "2s"
tunnel_idle = "10m"
"#,
    )
    .unwrap();
    assert_eq!(c.runtime.cpus, vec![0, 2, 3]);
    assert_eq!(c.runtime.shutdown_timeout, Duration::from_millis(250));
    let u = &c.upstreams[0];
    assert_eq!(u.algorithm, Algorithm::LeastConn);
    assert_eq!(u.keepalive, 8);
    assert_eq!(
        u.backends.iter().map(|b| b.weight).collect::<Vec<_>>(),
        vec![5, 1, 1]
    );
    assert_eq!(u.timeouts.response, Duration::from_secs(60));
    assert_eq!(u.timeouts.send, Duration::from_secs(5));
    assert_eq!(u.upgrade.tunnel_idle, Duration::from_secs(600));
    assert!(u.upgrade.enabled, "upgrades pass by default");
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("127.0.0.1:8883"), "{:?}", c.warnings);
}

#[test]
fn unknown_algorithm_names_place_key_and_choices() {
    let e = err(&MINIMAL.replace(
        "[upstream.app]\n",
        "[upstream.app]\nalgorithm = \"leastconn\"\n",
    ));
    assert_eq!(
        e,
        "pinlb.toml:7:13: upstream.app.algorithm: unknown value \"leastconn\", expected one of round_robin, least_conn, random_two, ewma, hash"
    );
}

#[test]
fn unknown_keys_are_errors() {
    let e = err(&MINIMAL.replace(
        "[upstream.app]\n",
        "[upstream.app]\nalgoritm = \"least_conn\"\n",
    ));
    assert!(
        e.starts_with("pinlb.toml:7:1: upstream.app.algoritm: unknown field `algoritm`"),
        "{e}"
    );
}

#[test]
fn every_unknown_key_and_wrong_type_is_reported_with_the_validation_errors_of_the_rest() {
    // Two unknown keys in two tables, a value of the wrong type, and a validation error (the
    // weight) in a third: serde alone would report only one of the first three.
    let text = MINIMAL
        .replace(
            "upstream = \"app\"\n",
            "upstream = \"app\"\nh2 = true\nbacklog = \"lots\"\n",
        )
        .replace(
            "[upstream.app]\n",
            "[upstream.app]\nalgoritm = \"least_conn\"\n",
        )
        .replace("8881\" }", "8881\", weight = 0 }");
    let e = parse(&text).expect_err("rejected");
    let found: Vec<(usize, &str)> = e
        .errors()
        .iter()
        .map(|e| (e.line, e.key.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (5, "listener[0].h2"),
            (6, "listener[0].backlog"),
            (9, "upstream.app.algoritm"),
            (10, "upstream.app.backends[0].weight"),
        ],
        "{e}"
    );
}

#[test]
fn what_only_follows_from_a_key_left_out_is_not_reported_again() {
    // A backend list of the wrong type is left out: the upstream then has no backends, which
    // is not a second mistake. The listener's bad address, in another table, is one.
    let text = MINIMAL
        .replace("[{ address = \"127.0.0.1:8881\" }]", "\"127.0.0.1:8881\"")
        .replace("127.0.0.1:8888", "127.0.0.1");
    let e = parse(&text).expect_err("rejected");
    let found: Vec<&str> = e.errors().iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        found,
        ["listener[0].address", "upstream.app.backends"],
        "{e}"
    );
    assert!(raw::follows_from("upstream.app", "upstream.app.backends"));
    assert!(raw::follows_from(
        "upstream.app.backends[0]",
        "upstream.app.backends"
    ));
    assert!(!raw::follows_from(
        "upstream.app.backends_x",
        "upstream.app.backends"
    ));
    assert!(!raw::follows_from(
        "upstream.app.hash",
        "upstream.app.algorithm"
    ));
}

#[test]
fn weight_zero_is_rejected_at_the_weight() {
    let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = 0 }"));
    assert_eq!(
        e,
        "pinlb.toml:7:52: upstream.app.backends[0].weight: weight 0 is not allowed, expected a positive integer"
    );
}

#[test]
fn empty_upstream_is_rejected() {
    let e = err(&MINIMAL.replace("[{ address = \"127.0.0.1:8881\" }]", "[]"));
    assert_eq!(
        e,
        "pinlb.toml:7:12: upstream.app.backends: an upstream needs at least one backend"
    );
}

#[test]
fn listener_to_unknown_upstream_is_rejected() {
    let e = err(&MINIMAL.replace("upstream = \"app\"", "upstream = \"web\""));
    assert_eq!(
        e,
        "pinlb.toml:4:12: listener[0].upstream: unknown upstream \"web\", expected one of: app"
    );
}

#[test]
fn duplicate_backends_are_rejected() {
    let e = err(&MINIMAL.replace(
        "[{ address = \"127.0.0.1:8881\" }]",
        "[{ address = \"127.0.0.1:8881\" }, { address = \"127.0.0.1:8881\" }]",
    ));
    assert!(e.starts_with("pinlb.toml:7:57: upstream.app.backends[1].address: duplicate backend address 127.0.0.1:8881"), "{e}");
}

#[test]
fn one_backend_address_may_be_listed_by_two_upstreams() {
    let c = parse(&format!(
        "{MINIMAL}\n[upstream.api]\nbackends = [{{ address = \"127.0.0.1:8881\", weight = 3 }}]\n"
    ))
    .unwrap();
    let listed: Vec<(&str, String, u32)> = c
        .upstreams
        .iter()
        .flat_map(|u| {
            u.backends
                .iter()
                .map(|b| (u.name.as_str(), b.address.to_string(), b.weight))
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("api", "127.0.0.1:8881".to_string(), 3),
            ("app", "127.0.0.1:8881".to_string(), 1)
        ]
    );
}

#[test]
fn duplicate_listeners_are_rejected_but_port_0_may_repeat() {
    let two = |addr: &str| {
        format!("{MINIMAL}\n[[listener]]\naddress = \"{addr}\"\nupstream = \"app\"\n")
            .replace("127.0.0.1:8888", addr)
    };
    let e = err(&two("127.0.0.1:8888"));
    assert!(
        e.starts_with(
            "pinlb.toml:10:11: listener[1].address: duplicate listener address 127.0.0.1:8888"
        ),
        "{e}"
    );
    assert_eq!(parse(&two("127.0.0.1:0")).unwrap().listeners.len(), 2);
}

#[test]
fn core_outside_allowed_set_names_core_and_set() {
    let e = err(&format!("[runtime]\ncpus = \"2-7\"\n{MINIMAL}"));
    assert_eq!(
        e,
        "pinlb.toml:2:8: runtime.cpus: core 4 is not in this process's allowed set 0-3"
    );
}

#[test]
fn bad_duration_says_what_is_expected() {
    let e = err(&format!("[runtime]\nshutdown_timeout = \"30\"\n{MINIMAL}"));
    assert!(
        e.starts_with("pinlb.toml:2:20: runtime.shutdown_timeout: invalid duration \"30\""),
        "{e}"
    );
}

#[test]
fn durations_over_a_year_are_rejected() {
    let e = err(&format!(
        "[limits]\nheader_timeout = \"400days\"\n{MINIMAL}"
    ));
    assert!(
        e.starts_with(
            "pinlb.toml:2:18: limits.header_timeout: duration \"400days\" is too long, expected at most 365 days"
        ),
        "{e}"
    );
    let ok = parse(&format!(
        "[limits]\nheader_timeout = \"365days\"\n{MINIMAL}"
    ));
    assert!(ok.is_ok(), "{:?}", ok.err());
}

#[test]
fn type_errors_inside_spanned_values_name_the_users_key() {
    let e = err(&MINIMAL.replace("8881\" }", "8881\", weight = \"heavy\" }"));
    assert!(
        e.starts_with("pinlb.toml:7:52: upstream.app.backends[0].weight: "),
        "{e}"
    );
    let e = err(&format!(
        "{MINIMAL}\n[upstream.app.timeouts]\nresponse = \"30\"\n"
    ));
    assert!(
        e.starts_with("pinlb.toml:10:12: upstream.app.timeouts.response: invalid duration"),
        "{e}"
    );
}

#[test]
fn zero_timeouts_are_rejected() {
    let e = err(&format!(
        "{MINIMAL}\n[upstream.app.timeouts]\nclient_idle = \"0s\"\n"
    ));
    assert_eq!(
        e,
        "pinlb.toml:10:15: upstream.app.timeouts.client_idle: a duration of 0 is not allowed, expected a positive duration such as \"1s\""
    );
}

#[test]
fn bad_address_says_what_is_expected() {
    let e = err(&MINIMAL.replace("127.0.0.1:8888", "localhost"));
    assert!(
        e.starts_with("pinlb.toml:3:11: listener[0].address: invalid address \"localhost\""),
        "{e}"
    );
}

#[test]
fn syntax_errors_have_a_position() {
    let e = err("[runtime\ncpus = [0]\n");
    assert!(e.starts_with("pinlb.toml:1:"), "{e}");
}

#[test]
fn every_section_s_error_is_reported_in_file_order_then_their_count() {
    // Validated limits first and log last; reported as the file has them.
    let text = r#"[log]
format = "json"

[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[upstream.app]
backends = [{ address = "127.0.0.1:8881", weight = 0 }]

[limits]
max_headers = 0
"#;
    let e = parse(text).expect_err("three mistakes");
    assert_eq!(e.errors().len(), 3);
    assert_eq!(
        e.to_string(),
        [
            "pinlb.toml:2:10: log.format: set without log.access, expected log.access too (\"stdout\" or a file path)",
            "pinlb.toml:9:52: upstream.app.backends[0].weight: weight 0 is not allowed, expected a positive integer",
            "pinlb.toml:12:15: limits.max_headers: 0 is out of range, expected 1 to 1000",
            "3 errors",
        ]
        .join("\n")
    );
}

#[test]
fn a_listener_naming_an_upstream_that_failed_is_no_error_of_its_own() {
    let text = r#"[[listener]]
address = "127.0.0.1:8888"
upstream = "app"

[[listener]]
address = "127.0.0.1:8889"
upstream = "web"

[upstream.app]
backends = []
"#;
    assert_eq!(
        err(text),
        [
            "pinlb.toml:7:12: listener[1].upstream: unknown upstream \"web\", expected one of: app",
            "pinlb.toml:10:12: upstream.app.backends: an upstream needs at least one backend",
            "2 errors",
        ]
        .join("\n")
    );
}

#[test]
fn each_listener_s_error_is_reported() {
    let text = format!(
        "{MINIMAL}[[listener]]\naddress = \"localhost\"\nupstream = \"app\"\n[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n"
    );
    assert_eq!(
        err(&text),
        [
            "pinlb.toml:9:11: listener[1].address: invalid address \"localhost\", expected IP:PORT such as \"127.0.0.1:8888\"",
            "pinlb.toml:12:11: listener[2].address: duplicate listener address 127.0.0.1:8888; each address may be listened on once",
            "2 errors",
        ]
        .join("\n")
    );
}

#[test]
fn a_syntax_error_stops_at_itself_and_a_type_error_does_not() {
    // A mistake before it, and one after: neither is reported.
    let e = parse("[limits]\nmax_headers = 0\n[runtime\ncpus = [0]\n[admin]\naddress = \"x\"\n")
        .expect_err("a syntax error");
    assert_eq!(e.errors().len(), 1, "{e}");
    assert!(e.to_string().starts_with("pinlb.toml:3:"), "{e}");
    // A value of the wrong type is left out, and the rest of the file is validated.
    let e = parse(&format!(
        "[limits]\nmax_headers = 0\n{}",
        MINIMAL.replace("8881\" }", "8881\", weight = \"heavy\" }")
    ))
    .expect_err("a type error");
    assert_eq!(
        e.to_string(),
        "pinlb.toml:2:15: limits.max_headers: 0 is out of range, expected 1 to 1000\n\
         pinlb.toml:9:52: upstream.app.backends[0].weight: invalid type: string \"heavy\", expected u32\n\
         2 errors"
    );
}

#[test]
fn health_values_that_could_never_work_are_rejected_at_their_place() {
    let with = |keys: &str| err(&format!("{MINIMAL}\n[upstream.app.health]\n{keys}\n"));
    assert_eq!(
        with("expect = []"),
        "pinlb.toml:10:10: upstream.app.health.expect: an empty list passes no probe, expected a status such as 200, a range such as \"200-399\", or a list of them"
    );
    assert!(
        with("path = \"/health#top\"")
            .starts_with("pinlb.toml:10:8: upstream.app.health.path: invalid path \"/health#top\""),
        "{}",
        with("path = \"/health#top\"")
    );
    assert_eq!(
        with("interval = \"2d\""),
        "pinlb.toml:10:12: upstream.app.health.interval: 172800s is too long, expected at most 1 day"
    );
}

#[test]
fn trusted_proxies_are_networks_or_addresses() {
    let c = parse(&format!(
        "{MINIMAL}\n[forwarded]\ntrusted = [\"10.0.0.0/8\", \"192.0.2.7\", \"::1\"]\n"
    ))
    .unwrap();
    let nets: Vec<String> = c.trusted.iter().map(|n| n.to_string()).collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.0.2.7/32", "::1/128"]);
    assert!(parse(MINIMAL).unwrap().trusted.is_empty());
    assert_eq!(
        err(&format!(
            "{MINIMAL}\n[forwarded]\ntrusted = [\"10.0.0.0/33\"]\n"
        )),
        "pinlb.toml:10:12: forwarded.trusted[0]: invalid network \"10.0.0.0/33\", expected an address or a CIDR block such as \"10.0.0.0/8\""
    );
}

#[test]
fn an_upstream_may_turn_upgrades_off_and_tunnel_idle_must_be_positive() {
    let off =
        parse(&MINIMAL.replace("[upstream.app]\n", "[upstream.app]\nupgrade = false\n")).unwrap();
    assert!(!off.upstreams[0].upgrade.enabled);
    assert_eq!(
        parse(MINIMAL).unwrap().upstreams[0].upgrade.tunnel_idle,
        Duration::from_secs(3600)
    );
    let e = err(&format!(
        "{MINIMAL}\n[upstream.app.timeouts]\ntunnel_idle = \"0s\"\n"
    ));
    assert!(e.contains("upstream.app.timeouts.tunnel_idle"), "{e}");
}

#[test]
fn hash_needs_its_key_and_only_hash_takes_one() {
    let with =
        |lines: &str| MINIMAL.replace("[upstream.app]\n", &format!("[upstream.app]\n{lines}\n"));
    let c = parse(&with("algorithm = \"hash\"\nhash = \"cookie:Session\"")).unwrap();
    assert_eq!(c.upstreams[0].hash, Some(HashKey::Cookie("session".into())));
    assert_eq!(
        err(&with("algorithm = \"hash\"")),
        "pinlb.toml:7:13: upstream.app.algorithm: algorithm \"hash\" needs a key: hash = \"client_ip\", \"uri\", \"header:NAME\" or \"cookie:NAME\""
    );
    assert_eq!(
        err(&with("algorithm = \"hash\"\nhash = \"ip\"")),
        "pinlb.toml:8:8: upstream.app.hash: unknown value \"ip\", expected \"client_ip\", \"uri\", \"header:NAME\" or \"cookie:NAME\""
    );
    assert_eq!(
        err(&with("algorithm = \"hash\"\nhash = \"header:\"")),
        "pinlb.toml:8:8: upstream.app.hash: \"header:\" names no header, expected \"client_ip\", \"uri\", \"header:NAME\" or \"cookie:NAME\""
    );
    assert_eq!(
        err(&with("hash = \"uri\"")),
        "pinlb.toml:7:8: upstream.app.hash: hash is the key of algorithm \"hash\", but this upstream balances by \"round_robin\""
    );
}

#[test]
fn backups_need_a_primary_and_no_hash() {
    let two = |extra: &str, second: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n[upstream.app]\n{extra}\n\
             backends = [{{ address = \"127.0.0.1:8881\"{second} }}, {{ address = \"127.0.0.1:8882\", backup = true }}]\n"
        )
    };
    let c = parse(&two("", "")).unwrap();
    assert_eq!(
        c.upstreams[0]
            .backends
            .iter()
            .map(|b| b.backup)
            .collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(
        err(&two("", ", backup = true")),
        "pinlb.toml:6:52: upstream.app.backends[0].backup: every backend is a backup: an upstream needs at least one primary backend (backup = false)"
    );
    let e = err(&two("algorithm = \"hash\"\nhash = \"uri\"", ""));
    assert!(
        e.starts_with(
            "pinlb.toml:7:84: upstream.app.backends[1].backup: backup backends can't be used with algorithm \"hash\""
        ),
        "{e}"
    );
}

#[test]
fn ewma_decay_defaults_to_one_second_and_must_be_positive() {
    let with =
        |lines: &str| MINIMAL.replace("[upstream.app]\n", &format!("[upstream.app]\n{lines}\n"));
    let c = parse(&with("algorithm = \"ewma\"")).unwrap();
    assert_eq!(c.upstreams[0].ewma_decay, Duration::from_secs(1));
    let c = parse(&with("algorithm = \"ewma\"\newma_decay = \"2s\"")).unwrap();
    assert_eq!(c.upstreams[0].ewma_decay, Duration::from_secs(2));
    assert!(
        err(&with("ewma_decay = \"0s\""))
            .starts_with("pinlb.toml:7:14: upstream.app.ewma_decay: a duration of 0")
    );
}

#[test]
fn the_upgrade_socket_is_off_unless_given_and_must_be_an_absolute_short_path() {
    assert_eq!(parse(MINIMAL).unwrap().runtime.upgrade_socket, None);
    let on = parse(&format!(
        "[runtime]\nupgrade_socket = \"/run/pinlb/upgrade.sock\"\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        on.runtime.upgrade_socket,
        Some(std::path::PathBuf::from("/run/pinlb/upgrade.sock"))
    );
    assert_eq!(
        err(&format!(
            "[runtime]\nupgrade_socket = \"upgrade.sock\"\n{MINIMAL}"
        )),
        "pinlb.toml:2:18: runtime.upgrade_socket: expected an absolute path (for example \"/run/pinlb/upgrade.sock\")"
    );
    let long = format!("/{}", "a".repeat(107));
    assert_eq!(
        err(&format!(
            "[runtime]\nupgrade_socket = \"{long}\"\n{MINIMAL}"
        )),
        "pinlb.toml:2:18: runtime.upgrade_socket: expected at most 107 bytes (a unix socket's limit), not 108"
    );
}

fn with_backends(backends: &str) -> String {
    MINIMAL.replace("[{ address = \"127.0.0.1:8881\" }]", backends)
}

#[test]
fn a_backend_may_be_a_host_name_or_an_srv_name_with_resolve_bounds() {
    let c = parse(&with_backends(
        "[{ address = \"app.internal:8080\", weight = 2 }, { srv = \"_http._tcp.app.internal.\" }]",
    ))
    .unwrap();
    let u = &c.upstreams[0];
    assert!(u.backends.is_empty());
    assert_eq!(
        u.names[0].name,
        DnsName::Host {
            host: "app.internal".into(),
            port: 8080
        }
    );
    assert_eq!(u.names[0].weight, 2);
    assert_eq!(
        u.names[1].name,
        DnsName::Srv("_http._tcp.app.internal".into())
    );
    assert_eq!(u.resolve, Resolve::default());
    assert!(c.resolver.nameservers.is_empty());

    let c = parse(&format!(
        "{}[upstream.app.resolve]\ninterval = \"500ms\"\n[resolver]\nnameservers = [\"10.96.0.10\", \"127.0.0.1:5353\"]\n",
        with_backends("[{ srv = \"_x._tcp.y\" }]")
    ))
    .unwrap();
    assert_eq!(c.upstreams[0].resolve.interval, Duration::from_millis(500));
    assert_eq!(
        c.upstreams[0].resolve.min_interval,
        Duration::from_millis(500)
    );
    assert_eq!(
        c.resolver.nameservers,
        vec![
            "10.96.0.10:53".parse().unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        ]
    );
}

#[test]
fn bad_names_and_bounds_are_refused_at_their_place() {
    assert_eq!(
        err(&with_backends(
            "[{ address = \"a.b:80\", srv = \"_x._tcp.y\" }]"
        )),
        "pinlb.toml:7:41: upstream.app.backends[0].srv: set together with address = \"a.b:80\", expected one of address (IP:PORT or NAME:PORT) or srv (an SRV name)"
    );
    assert!(
        err(&with_backends("[{ weight = 2 }]")).contains("upstream.app.backends[0]: no address")
    );
    assert!(err(&with_backends("[{ srv = \"a..b\" }]")).contains("invalid SRV name \"a..b\""));
    assert!(
        err(&with_backends(
            "[{ address = \"a.b:80\" }, { address = \"a.b:80\" }]"
        ))
        .contains("duplicate backend a.b:80; each name may appear once")
    );
    assert!(err(&with_backends("[{ address = \"a b:80\" }]")).contains("invalid address"));
    assert!(
        err(&format!(
            "{}[upstream.app.resolve]\ninterval = \"1s\"\nmin_interval = \"2s\"\n",
            MINIMAL
        ))
        .contains("upstream.app.resolve.min_interval: 2s is longer than resolve.interval (1s)")
    );
    assert!(
        err(&format!(
            "{MINIMAL}[resolver]\nnameservers = [\"dns.google\"]\n"
        ))
        .contains("resolver.nameservers[0]: invalid nameserver \"dns.google\"")
    );
}

#[test]
fn a_key_of_another_table_says_which_tables_have_it() {
    let e = err(&format!("{MINIMAL}[upstream.app.health]\nmax_fails = 2\n"));
    assert!(
        e.ends_with("; max_fails is a key of [upstream.app.passive], not of [upstream.app.health]"),
        "{e}"
    );
    let e = err(&format!(
        "{MINIMAL}[[listener.route]]\npath = \"/a/\"\nupstream = \"app\"\nconnect = \"1s\"\n"
    ));
    assert!(
        e.ends_with(
            "; connect is a key of [listener.route.timeouts] or [upstream.NAME.timeouts], not of [listener.route]"
        ),
        "{e}"
    );
    let e = err(&format!("max_body = \"1MiB\"\n{MINIMAL}"));
    assert!(
        e.ends_with(
            "; max_body is a key of [limits] or [listener.mirror] or [listener.route.mirror], not of the top level"
        ),
        "{e}"
    );
    let e = err(&format!("{MINIMAL}[upstream.app.passive]\nweight = 2\n"));
    assert!(
        e.ends_with("; weight is a key of a backend, not of [upstream.app.passive]"),
        "{e}"
    );
    // A module's listener-only key (`redirect_https`) written in a route.
    let e = err(&format!(
        "{MINIMAL}[[listener.route]]\npath = \"/a/\"\nupstream = \"app\"\nredirect_https = true\n"
    ));
    assert!(
        e.ends_with("; redirect_https is a key of [listener], not of [listener.route]"),
        "{e}"
    );
    let expected = e.split("expected one of").nth(1).unwrap_or_default();
    assert!(
        expected.contains("`compress`") && !expected.contains("`redirect_https`"),
        "{e}"
    );
    // A key no table has gets no hint.
    let e = err(&format!("{MINIMAL}[upstream.app.passive]\nmax_failz = 2\n"));
    assert!(e.ends_with("`fail_on_status`"), "{e}");
}

#[test]
fn the_queue_and_learned_limits_are_on_by_default_and_a_queue_without_limits_is_warned_about() {
    let u = &parse(MINIMAL).unwrap().upstreams[0];
    assert_eq!(
        (u.queue, u.max_connecting),
        (10_000, Upstream::MAX_CONNECTING)
    );
    assert_eq!(u.adaptive, Some(Adaptive { min: 2, max: 1000 }));
    assert_eq!(u.timeouts.queue, Duration::from_secs(30));
    assert_eq!(u.timeouts.connect, Duration::from_secs(5));

    let c = parse(
        "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n[upstream.app]\nqueue = 100\nmax_connecting = 0\n\
         adaptive = false\nbackends = [{ address = \"127.0.0.1:8881\" }]\n[upstream.app.timeouts]\nqueue = \"2s\"\n",
    )
    .unwrap();
    let u = &c.upstreams[0];
    assert_eq!((u.queue, u.max_connecting, u.adaptive), (100, 0, None));
    assert_eq!(u.timeouts.queue, Duration::from_secs(2));
    assert_eq!(
        c.warnings,
        [
            "upstream.app.queue: adaptive = false and no backend has max_conns, so no request ever waits in the queue"
        ]
    );
    // The queue's default follows limits.max_connections.
    let c = parse(&format!("[limits]\nmax_connections = 300\n{MINIMAL}")).unwrap();
    assert_eq!(c.upstreams[0].queue, 300);
    let c = parse(&format!("{MINIMAL}adaptive_min = 4\nadaptive_max = 64\n")).unwrap();
    assert_eq!(c.upstreams[0].adaptive, Some(Adaptive { min: 4, max: 64 }));
    assert_eq!(
        err(&format!("{MINIMAL}adaptive_min = 8\nadaptive_max = 4\n")),
        "pinlb.toml:9:16: upstream.app.adaptive_max: 4 is below adaptive_min (8), expected 8 or more"
    );
    assert_eq!(
        err(&format!("{MINIMAL}adaptive_min = 0\n")),
        "pinlb.toml:8:16: upstream.app.adaptive_min: 0 is not allowed, expected 1 or more requests per backend"
    );
    let limited = parse(
        "[[listener]]\naddress = \"127.0.0.1:8888\"\nupstream = \"app\"\n[upstream.app]\nqueue = 100\n\
         backends = [{ address = \"127.0.0.1:8881\", max_conns = 4 }]\n",
    )
    .unwrap();
    assert!(limited.warnings.is_empty(), "{:?}", limited.warnings);
    assert_eq!(
        err(&format!(
            "{MINIMAL}[upstream.app.timeouts]\nqueue = \"0s\"\n"
        )),
        "pinlb.toml:9:9: upstream.app.timeouts.queue: a duration of 0 is not allowed, expected a positive duration such as \"1s\""
    );
}

#[test]
fn listener_backlog_defaults_to_somaxconn_and_must_be_a_positive_int() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.listeners[0].backlog, crate::sys::limits::somaxconn());
    let with = |v: &str| {
        MINIMAL.replace(
            "upstream = \"app\"\n",
            &format!("upstream = \"app\"\nbacklog = {v}\n"),
        )
    };
    assert_eq!(parse(&with("128")).unwrap().listeners[0].backlog, 128);
    assert_eq!(
        parse(&with("2147483647")).unwrap().listeners[0].backlog,
        i32::MAX as u32
    );
    for bad in ["0", "-1", "2147483648"] {
        assert_eq!(
            err(&with(bad)),
            format!(
                "pinlb.toml:5:11: listener[0].backlog: {bad} is out of range, expected a number of connections from 1 to 2147483647"
            )
        );
    }
    let text = err(&with("\"lots\""));
    assert!(
        text.starts_with("pinlb.toml:5:11: listener[0].backlog: invalid type: string \"lots\""),
        "{text}"
    );
    let text = err(&format!("[limits]\nbacklog = 10\n{MINIMAL}"));
    assert!(
        text.contains("backlog is a key of [listener], not of [limits]"),
        "{text}"
    );
}

#[test]
fn every_table_s_keys_are_read_from_the_raw_types() {
    let tables = raw::tables();
    let keys = |table: &str| {
        tables
            .get(table)
            .unwrap_or_else(|| panic!("no table {table:?} in {:?}", tables.keys()))
    };
    assert_eq!(
        keys(""),
        &[
            "runtime",
            "listener",
            "upstream",
            "limits",
            "forwarded",
            "admin",
            "log",
            "http2",
            "resolver",
            "request_id",
            "limit",
            "cache"
        ]
    );
    // Through lists, maps, `Option` and `Spanned`, in serde's order.
    assert_eq!(
        keys("upstream.NAME.backends[]"),
        &[
            "address",
            "srv",
            "weight",
            "cpus",
            "max_conns",
            "slow_start",
            "backup"
        ]
    );
    assert!(keys("listener.route.timeouts").contains(&"connect"));
    assert!(keys("listener.tls.certificate[]").contains(&"cert"));
    assert!(keys("upstream.NAME.spawn").contains(&"port_base"));
    assert!(keys("listener.rate_limit[]").contains(&"nodelay"));
    // Tables read by a hand-written deserialiser that takes a value or a table.
    assert!(keys("listener.compress").contains(&"gzip_level"));
    assert!(keys("listener.route.compress").contains(&"zstd_level"));
    assert!(keys("listener.auth_basic").contains(&"user_file"));
    // A map of the user's own keys is no table.
    assert!(!tables.contains_key("upstream.NAME.spawn.env"));
}

/// The sections of docs/configuration.md, each as its heading's level, the table its heading
/// names (`upstream.NAME.health` for "## `[upstream.NAME.health]`: …"; `None` for a heading
/// that names none), and its text up to the next heading of the same level or above.
fn doc_sections(doc: &str) -> Vec<(usize, Option<String>, String)> {
    let mut headings = Vec::new();
    let mut fenced = false;
    let lines: Vec<&str> = doc.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let level = line.chars().take_while(|c| *c == '#').count();
        let table = line.split('`').nth(1).and_then(|code| {
            let name = code.trim_start_matches('[').trim_end_matches(']');
            (code.starts_with('[') && name.len() + 2 <= code.len()).then(|| name.to_string())
        });
        headings.push((i, level, table));
    }
    headings
        .iter()
        .enumerate()
        .map(|(n, (start, level, table))| {
            let end = headings[n + 1..]
                .iter()
                .find(|(_, l, _)| l <= level)
                .map_or(lines.len(), |(i, _, _)| *i);
            (*level, table.clone(), lines[*start..end].join("\n"))
        })
        .collect()
}

/// Whether `text` names `key` as a key: `` `key` `` or `key = …`.
fn names_key(text: &str, key: &str) -> bool {
    text.match_indices(key).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + key.len()..];
        !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && (after.starts_with('`') || after.starts_with(" ="))
    })
}

#[test]
fn docs_configuration_md_documents_every_key_and_no_key_that_does_not_exist() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let sections = doc_sections(&doc);
    let section = |table: &str| {
        sections
            .iter()
            .find(|(_, t, _)| t.as_deref() == Some(table))
            .map(|(_, _, text)| text.as_str())
    };
    // Documented in its table's section or in that of a table around it, by its name or by
    // its dotted path from there (`resolve.interval`, `backends[].srv`, `resolver.nameservers`
    // anywhere).
    let documented = |table: &str, key: &str| {
        let full = if table.is_empty() {
            key.to_string()
        } else {
            format!("{table}.{key}")
        };
        // A table (or a map or list of them): documented by its keys, each checked on its own.
        if ["", "[]", ".NAME"]
            .iter()
            .any(|end| raw::tables().contains_key(&format!("{full}{end}")))
        {
            return true;
        }
        let mut around = table.replace("[]", "");
        loop {
            let text = if around.is_empty() {
                Some(doc.as_str())
            } else {
                section(&around)
            };
            let rel = full
                .strip_prefix(&around)
                .unwrap_or(&full)
                .trim_start_matches("[]")
                .trim_start_matches('.');
            // The whole file names a top-level table by its section only.
            let by_path = !around.is_empty() || rel.contains('.');
            let names = |t: &str| {
                (!around.is_empty() && names_key(t, key))
                    || (by_path && (names_key(t, rel) || names_key(t, &rel.replace("[]", ""))))
            };
            if text.is_some_and(names) {
                return true;
            }
            match around.rsplit_once('.') {
                Some((up, _)) => around = up.to_string(),
                None if !around.is_empty() => around.clear(),
                None => return false,
            }
        }
    };
    let mut missing = Vec::new();
    for (table, keys) in raw::tables() {
        for key in keys {
            if !documented(table, key) {
                missing.push(if table.is_empty() {
                    format!("[{key}]")
                } else {
                    format!("{table}.{key}")
                });
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys the configuration has that docs/configuration.md does not document: {missing:?}"
    );

    // Each key row of a table's section ("| `key` |", "| `a` / `b` |", "| `cert`, `key` |")
    // names keys that table has.
    let mut unknown = Vec::new();
    for (_, table, text) in &sections {
        let Some(table) = table else { continue };
        let Some(keys) = raw::tables()
            .get(table.as_str())
            .or_else(|| raw::tables().get(&format!("{table}[]")))
        else {
            unknown.push(format!("[{table}]"));
            continue;
        };
        // The rows of the section's own key tables (headed `| key |`), up to its first
        // subsection.
        let mut in_keys = false;
        let mut rows = Vec::new();
        for line in text.lines().skip(1).take_while(|l| !l.starts_with('#')) {
            if !line.starts_with('|') {
                in_keys = false;
            } else if line.starts_with("| key |") {
                in_keys = true;
            } else if in_keys && line.starts_with("| `") {
                rows.push(line);
            }
        }
        for row in rows {
            let cell = row.split('|').nth(1).unwrap_or_default().trim();
            if cell.starts_with("`[") {
                continue;
            }
            for name in cell.split(['/', ',']).map(|n| n.trim().trim_matches('`')) {
                if !keys.contains(&name) {
                    unknown.push(format!("{table}.{name}"));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "docs/configuration.md documents keys the configuration does not have: {unknown:?}"
    );
}

#[test]
fn retry_on_names_nginx_conditions_and_statuses_and_the_budget_is_a_share() {
    let retry = |extra: &str| {
        let c = parse(&format!("{MINIMAL}[upstream.app.retry]\n{extra}")).unwrap();
        c.upstreams[0].retry.clone()
    };
    let d = retry("");
    assert_eq!(
        (d.on_error, d.on_timeout, d.on_status.is_empty()),
        (true, true, true)
    );
    assert_eq!((d.budget_per_mille, d.budget_min), (200, 10));
    let r =
        retry("on = [\"timeout\", \"http_502\", \"http_503\"]\nbudget = 0.25\nbudget_min = 0\n");
    assert_eq!((r.on_error, r.on_timeout), (false, true));
    assert!(r.on_status.contains(502) && r.on_status.contains(503) && !r.on_status.contains(504));
    assert_eq!((r.budget_per_mille, r.budget_min), (250, 0));
    assert_eq!(retry("on = [\"off\"]\n").tries, 1);
    assert_eq!(
        err(&format!(
            "{MINIMAL}[upstream.app.retry]\non = [\"error\", \"http_999\"]\n"
        )),
        "pinlb.toml:9:16: upstream.app.retry.on: unknown condition \"http_999\", expected \"error\", \"timeout\", \"invalid_header\", \"http_NNN\" with NNN a status from 400 to 599, or \"off\" alone"
    );
    assert_eq!(
        err(&format!("{MINIMAL}[upstream.app.retry]\nbudget = 20\n")),
        "pinlb.toml:9:10: upstream.app.retry.budget: expected a share of requests from 0.0 to 1.0, such as 0.2"
    );
}

#[test]
fn an_outlier_table_turns_ejection_on_with_envoys_times_and_checks_its_shares() {
    assert_eq!(parse(MINIMAL).unwrap().upstreams[0].outlier, None);
    let on = parse(&format!("{MINIMAL}[upstream.app.outlier]\n")).unwrap();
    assert_eq!(on.upstreams[0].outlier, Some(Outlier::default()));
    assert_eq!(
        err(&format!(
            "{MINIMAL}[upstream.app.outlier]\nsuccess_rate = 80\n"
        )),
        "pinlb.toml:9:16: upstream.app.outlier.success_rate: expected a share from 0.0 to 1.0, such as 0.8"
    );
    assert_eq!(
        err(&format!(
            "{MINIMAL}[upstream.app.outlier]\nbase_time = \"1m\"\nmax_time = \"10s\"\n"
        )),
        "pinlb.toml:10:12: upstream.app.outlier.max_time: 10s is shorter than base_time (60s), expected at least as long"
    );
}

/// The raw types as `pinlb import` writes them: read, written and read again, a file is the
/// same configuration (every shipped and bench configuration, and the fixtures that are
/// valid), and the written text is a fixed point (also for a file with every value form the
/// keys take: core lists and ranges, status ranges, one name or many, `auth_basic = "off"`,
/// `compress = true`, `cache = false`, module keys on listeners and routes).
#[test]
fn the_raw_types_written_back_read_again_as_they_were() {
    let write = |text: &str| {
        let src = Source {
            file: "pinlb.toml",
            text,
        };
        let parsed = RawConfig::parse(&src).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(parsed.errors.is_empty(), "{:?}\n{text}", parsed.errors);
        toml::to_string(&parsed.raw).unwrap()
    };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let cores: Vec<usize> = (0..64).collect();
    let (mut read, mut valid) = (0, 0);
    for dir in [
        "config",
        "tests/fixtures",
        "benches/peers",
        "benches/peers/overload",
    ] {
        let files = std::fs::read_dir(format!("{root}/{dir}")).unwrap();
        for path in files.map(|f| f.unwrap().path()) {
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let text = placeholders(&std::fs::read_to_string(&path).unwrap());
            let src = Source {
                file: "pinlb.toml",
                text: &text,
            };
            if RawConfig::parse(&src).is_ok_and(|p| p.errors.is_empty()) {
                let written = write(&text);
                assert_eq!(write(&written), written, "{path:?}");
                read += 1;
            }
            if let Ok(config) = Config::parse("pinlb.toml", &text, &cores) {
                let again = Config::parse("pinlb.toml", &write(&text), &cores);
                assert_eq!(again.as_ref(), Ok(&config), "{path:?}");
                valid += 1;
            }
        }
    }
    assert!(read >= 19 && valid >= 9, "only {read} read, {valid} valid");
    let every_form = r#"
        [runtime]
        cpus = "0,2-3"
        shutdown_timeout = "1500ms"
        [limits]
        max_body = "1MiB"
        header_timeout = "90s"
        [[listener]]
        address = "127.0.0.1:8080"
        upstream = "app"
        compress = true
        access = ["allow 10.0.0.0/8", "deny all"]
        auth_basic = "off"
        request_headers = { set = { "X-A" = "1" }, remove = ["X-B"] }
        error_page = [{ status = [502, 503], file = "/e.html" }]
        rate_limit = [{ zone = "z", burst = 5, nodelay = true }]
        conn_limit = { max = 10 }
        limit_rate = "100k"
        [[listener.route]]
        host = ["a.test", "*.b.test"]
        path = "/a/"
        compress = { algorithms = ["gzip"], gzip_level = 5 }
        cache = false
        timeouts = { response = "2s" }
        [[listener.route]]
        host = "c.test"
        respond = { status = 403, body = "no" }
        auth_basic = { realm = "r", user_file = "/u" }
        [upstream.app]
        algorithm = "least_conn"
        keepalive = 8
        backends = [{ address = "127.0.0.1:1", weight = 2, cpus = [4, 5, 6, 7] }]
        health = { path = "/h", expect = ["200-299", 304] }
        passive = { fail_on_status = 502 }
        sticky = { cookie = "srv" }
        [limit.z]
        rate = "10r/s"
        [cache.c]
        max_size = 1048576
    "#;
    let written = write(every_form);
    assert_eq!(write(&written), written);
    for form in [
        "cpus = [0, 2, 3]",
        r#"shutdown_timeout = "1500ms""#,
        "max_body = 1048576",
        r#"header_timeout = "90s""#,
        "compress = true",
        r#"auth_basic = "off""#,
        "cache = false",
        r#"host = ["a.test", "*.b.test"]"#,
        r#"host = "c.test""#,
        r#"expect = ["200-299", 304]"#,
        "fail_on_status = 502",
        "cpus = [4, 5, 6, 7]",
        "limit_rate = 100000",
    ] {
        assert!(written.contains(form), "{form} not in:\n{written}");
    }
    // An upstream built with every key left out has the file's defaults.
    assert_eq!(raw::RawUpstream::default().keepalive, 64);
    for default in [
        "weight = 1",
        "keepalive = 64",
        "[upstream.app.timeouts]",
        "route = []",
    ] {
        assert!(!written.contains(default), "{default} in:\n{written}");
    }
}

/// The bench configurations' `@NAME@` placeholders, each made a port number.
fn placeholders(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut port = 20_000;
    // Bounded by the text: each turn takes one placeholder out of what is left.
    while let Some((before, after)) = rest.split_once('@') {
        let Some((name, tail)) = after.split_once('@') else {
            break;
        };
        out.push_str(before);
        match name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            true => {
                port += 1;
                out.push_str(&port.to_string());
            }
            false => out.push_str(&format!("@{name}@")),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}
