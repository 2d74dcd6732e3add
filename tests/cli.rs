//! The `pinlb` command line: `check` on fixture files, `serve` refusing bad files, help and
//! version.
//!
//! Fixture paths are passed relative to the package root, as a user would type them, and every
//! error line must name the file exactly that way.

use crate::common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{allowed, bin, poll_blocking};

/// Runs `pinlb ARGS` in the package root.
fn pinlb(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run pinlb")
}

/// `pinlb check -c tests/fixtures/NAME` must exit 1 with exactly `expected` on stderr, where
/// `{file}` stands for the path as given.
fn assert_check_rejects(name: &str, expected: &str) {
    let file = format!("tests/fixtures/{name}");
    let out = pinlb(&["check", "-c", &file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{file}: stderr:\n{stderr}");
    assert_eq!(
        stderr.trim_end(),
        expected.replace("{file}", &file),
        "{file}"
    );
    assert!(
        out.stdout.is_empty(),
        "{file}: nothing on stdout for an invalid file"
    );
}

#[test]
fn check_rejects_an_unknown_algorithm_naming_place_key_and_choices() {
    assert_check_rejects(
        "unknown_algorithm.toml",
        r#"{file}:12:13: upstream.app.algorithm: unknown value "leastconn", expected one of round_robin, least_conn, random_two, ewma, hash"#,
    );
}

#[test]
fn check_rejects_an_unknown_key() {
    assert_check_rejects(
        "unknown_key.toml",
        "{file}:8:1: upstream.app.algoritm: unknown field `algoritm`, expected one of `algorithm`, `hash`, `ewma_decay`, `keepalive`, `backends`, `spawn`, `timeouts`, `max_conns`, `queue`, `adaptive`, `adaptive_min`, `adaptive_max`, `max_connecting`, `slow_start`, `health`, `passive`, `retry`, `upgrade`, `protocol`, `max_streams`, `tls`, `resolve`, `proxy_protocol`, `buffering`, `outlier`, `sticky`, `fastcgi`",
    );
}

#[test]
fn a_key_written_in_the_wrong_table_says_which_table_it_belongs_to() {
    assert_check_rejects(
        "backend_max_fails.toml",
        "{file}:8:43: upstream.app.backends[0].max_fails: unknown field `max_fails`, expected one of `address`, `srv`, `weight`, `cpus`, `max_conns`, `slow_start`, `backup`; max_fails is a key of [upstream.app.passive], not of a backend",
    );
    assert_check_rejects(
        "upstream_tries.toml",
        "{file}:13:1: upstream.app.passive.tries: unknown field `tries`, expected one of `max_fails`, `fail_timeout`, `fail_on_status`; tries is a key of [upstream.app.retry], not of [upstream.app.passive]",
    );
}

#[test]
fn check_rejects_weight_0_at_the_weight() {
    assert_check_rejects(
        "weight_zero.toml",
        "{file}:10:42: upstream.app.backends[1].weight: weight 0 is not allowed, expected a positive integer",
    );
}

#[test]
fn check_rejects_an_upstream_without_backends() {
    assert_check_rejects(
        "no_backends.toml",
        "{file}:9:12: upstream.app.backends: an upstream needs at least one backend",
    );
}

#[test]
fn check_rejects_a_listener_naming_an_unknown_upstream() {
    assert_check_rejects(
        "unknown_upstream.toml",
        r#"{file}:5:12: listener[0].upstream: unknown upstream "web", expected one of: api, app"#,
    );
}

#[test]
fn check_rejects_a_duplicate_backend_address_at_the_second_one() {
    assert_check_rejects(
        "duplicate_backend.toml",
        "{file}:11:15: upstream.app.backends[2].address: duplicate backend address 127.0.0.1:8881; each backend may appear once",
    );
}

#[test]
fn check_rejects_a_core_outside_the_allowed_set_naming_the_set() {
    let set = pinlb::sys::cpus::format_cpu_list(&allowed());
    assert_check_rejects(
        "core_not_allowed.toml",
        &format!(
            "{{file}}:4:8: runtime.cpus: core 4095 is not in this process's allowed set {set}"
        ),
    );
}

#[test]
fn check_rejects_a_duration_without_a_unit() {
    assert_check_rejects(
        "bad_duration.toml",
        r#"{file}:12:12: upstream.app.timeouts.response: invalid duration "30", expected a number with a unit, such as "250ms", "2s" or "1m""#,
    );
}

#[test]
fn check_rejects_a_missing_file_naming_it() {
    let out = pinlb(&["check", "-c", "tests/fixtures/does_not_exist.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.starts_with(
            "tests/fixtures/does_not_exist.toml: no such configuration file (looked in /"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains(":0:0"), "{stderr}");
}

#[test]
fn check_accepts_a_valid_file_and_prints_the_plan() {
    let out = pinlb(&["check", "-c", "tests/fixtures/valid.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        stderr.is_empty(),
        "a valid file gives no diagnostics: {stderr}"
    );

    let cores = allowed();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("runtime: {} worker(s), shutdown_timeout 5s", cores.len())
    );
    for (i, c) in cores.iter().enumerate() {
        assert_eq!(
            lines[1 + i],
            format!("  worker {i} -> core {c}"),
            "{stdout}"
        );
    }
    let rest = &lines[1 + cores.len()..];
    let map_at = rest
        .iter()
        .position(|l| *l == "core map:")
        .unwrap_or_else(|| panic!("no core map in:\n{stdout}"));
    // The core map: pinlb's workers on their cores. What it finds listening on the backends'
    // ports depends on the machine, so only the worker lines are checked here.
    for (i, c) in cores.iter().enumerate() {
        let line = format!("  core {c}: pinlb worker {i}");
        assert!(
            rest[map_at..].iter().any(|l| l.starts_with(&line)),
            "{line:?} in:\n{stdout}"
        );
    }
    assert_eq!(
        rest.last().copied(),
        Some("tests/fixtures/valid.toml: configuration is valid")
    );
    let rest = &rest[..map_at];
    // What the kernel and the limits of this machine make of the file.
    let listener = format!(
        "listener 127.0.0.1:8888 (backlog {}) -> upstream app",
        pinlb::sys::limits::somaxconn()
    );
    let hard = pinlb::sys::limits::nofile().expect("getrlimit").hard;
    // The file leaves max_connections to its default, which is lowered to fit, not warned
    // about.
    let fit = pinlb::sys::limits::fit_nofile(
        hard,
        pinlb::sys::limits::reserved_descriptors(cores.len(), 1, 2, false),
        10_000,
        false,
    );
    let fds = format!(
        "{}; the hard limit, which serve raises its soft limit to",
        fit.line
    );
    assert!(!stdout.contains("does not fit in"), "{stdout}");
    let limits = format!(
        "limits: request head 32768 bytes and 100 headers, uri 8192 bytes, body unlimited, head within 10s, body reads 60s apart at most, {} connections",
        fit.max_connections
    );
    let mut rest = rest.to_vec();
    if let Some(lowered) = &fit.lowered {
        assert_eq!(rest.pop(), Some(lowered.as_str()), "{stdout}");
    }
    assert_eq!(
        rest,
        [
            limits.as_str(),
            "forwarded: X-Forwarded-For kept and appended to for 10.0.0.0/8, 192.0.2.7/32, replaced for every other client",
            listener.as_str(),
            "upstream app: least_conn, keepalive 16 per backend per worker, timeouts connect 500ms response 30s send 60s client_idle 60s",
            "  health checks: GET /health every 2s, timeout 1s, rise 2 fall 3, expect 200,300-304, host app.local",
            "  passive checks: max_fails 2 within fail_timeout 5s, statuses 502,503,504 count as failures",
            "  adaptive concurrency limit per backend, 2 to 1000 (starts at 20, probes at 2 every 30 to 40 s); max_conns applies instead to 127.0.0.1:8881 (100); queue 10000, 30s",
            "  retry: at most 2 tries within 3s, non_idempotent false, bodies up to 16384 bytes kept for replay",
            "  backend 127.0.0.1:8881 weight 5, max_conns 100, slow_start 30s",
            "  backend 127.0.0.1:8882 weight 1",
            "admin: http://127.0.0.1:9901/ (metrics, status, control, reload)",
            "access log: /var/log/pinlb/access.log (json)",
            fds.as_str(),
        ],
        "{stdout}"
    );
}

#[test]
fn serve_refuses_an_invalid_file_with_the_same_message_and_exit_1() {
    let out = pinlb(&["serve", "-c", "tests/fixtures/unknown_algorithm.toml"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        r#"tests/fixtures/unknown_algorithm.toml:12:13: upstream.app.algorithm: unknown value "leastconn", expected one of round_robin, least_conn, random_two, ewma, hash"#
    );
}

/// The fixture's four mistakes, in file order, then their count.
const SEVERAL_MISTAKES: &str = r#"{file}:6:11: listener[0].address: invalid address "localhost:8888": host names are not resolved; write the IP address and port, such as "127.0.0.1:8888" or "[::1]:8888"
{file}:16:42: upstream.app.backends[1].weight: weight 0 is not allowed, expected a positive integer
{file}:20:13: upstream.api.algorithm: algorithm "hash" needs a key: hash = "client_ip", "uri", "header:NAME" or "cookie:NAME"
{file}:24:11: admin.address: 0.0.0.0:9901 is not a loopback address, so admin.token or admin.token_file must be set: anyone who can reach it could take backends out and reload the config
4 errors"#;

#[test]
fn check_reports_every_mistake_of_a_file_in_one_run() {
    assert_check_rejects("several_mistakes.toml", SEVERAL_MISTAKES);
}

#[test]
fn check_reports_an_unknown_key_a_bad_address_and_a_bad_duration_in_three_tables_at_once() {
    // serde stops at the first unknown key; the rest of the file is still read and validated.
    assert_check_rejects(
        "mistakes_of_every_kind.toml",
        r#"{file}:6:1: runtime.shutdown_timout: unknown field `shutdown_timout`, expected one of `cpus`, `shutdown_timeout`, `upgrade_socket`
{file}:9:11: listener[0].address: invalid address "127.0.0.1", expected IP:PORT such as "127.0.0.1:8888"
{file}:16:11: upstream.app.timeouts.connect: invalid duration "5", expected a number with a unit, such as "250ms", "2s" or "1m"
3 errors"#,
    );
}

#[test]
fn check_reads_the_other_sections_when_a_table_lacks_a_key_it_needs() {
    assert_check_rejects(
        "wrong_type_of_a_needed_key.toml",
        r#"{file}:5:12: runtime.cpus[1]: invalid core list "x" ("x" is not a core number), expected a core id, a range string like "2-5", or a list of them
{file}:8:11: listener[0].address: invalid type: integer `8080`, expected a string
{file}:12:43: upstream.app.backends[0].weigth: unknown field `weigth`, expected one of `address`, `srv`, `weight`, `cpus`, `max_conns`, `slow_start`, `backup`
3 errors"#,
    );
}

#[test]
fn serve_refuses_a_file_with_several_mistakes_listing_every_one() {
    let file = "tests/fixtures/several_mistakes.toml";
    let out = pinlb(&["serve", "-c", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end(), SEVERAL_MISTAKES.replace("{file}", file));
}

#[test]
fn help_lists_the_subcommands() {
    let out = pinlb(&["--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout.contains("Usage: pinlb"), "{stdout}");
    assert!(stdout.contains("serve"), "{stdout}");
    assert!(stdout.contains("check"), "{stdout}");

    let out = pinlb(&["check", "--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout.contains("--config <FILE>"), "{stdout}");
}

#[test]
fn version_prints_the_package_version_and_a_debug_build_says_so() {
    let out = pinlb(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    // The test's profile is the binary's: both debug, or both release.
    let build = if cfg!(debug_assertions) {
        " (debug build)"
    } else {
        ""
    };
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("pinlb {}{build}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_missing_subcommand_is_a_usage_error() {
    let out = pinlb(&[]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error status");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage: pinlb"));
}

#[test]
fn check_rejects_two_listeners_on_the_same_address_at_the_second_one() {
    // Both would bind (SO_REUSEPORT), and the kernel would then split one port's connections
    // between two upstreams at random: this must be a configuration error.
    let file = "tests/fixtures/duplicate_listener.toml";
    let out = pinlb(&["check", "-c", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "two listeners on 127.0.0.1:8888 were accepted:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.starts_with(&format!("{file}:9:11: listener[1].address: ")),
        "{stderr}"
    );
    assert!(stderr.contains("127.0.0.1:8888"), "{stderr}");
}

#[test]
fn check_accepts_cores_written_as_a_range_string() {
    let cores = allowed();
    let list = pinlb::sys::cpus::format_cpu_list(&cores);
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/valid.toml"
    ))
    .unwrap()
    .replace("[runtime]\n", &format!("[runtime]\ncpus = \"{list}\"\n"));
    let path = common::temp_config(&text);
    let out = pinlb(&["check", "-c", path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (i, c) in cores.iter().enumerate() {
        assert!(
            stdout.contains(&format!("\n  worker {i} -> core {c}\n")),
            "{stdout}"
        );
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn serve_exits_1_naming_the_address_when_it_is_taken() {
    // Held without SO_REUSEPORT, so pinlb cannot share it.
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap();
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/valid.toml"
    ))
    .unwrap()
    .replace("127.0.0.1:8888", &addr.to_string());
    let path = common::temp_config(&text);
    let mut child = Command::new(bin())
        .args(["serve", "-c", path.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // At most 250 polls 20 ms apart; a pinlb that did start is killed, which is why this polls
    // rather than blocks in `wait`.
    let status = poll_blocking(250, Duration::from_millis(20), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = std::fs::remove_file(path);
    let status = status
        .unwrap_or_else(|| panic!("pinlb kept running on a taken address; stderr:\n{stderr}"));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("pinlb: cannot listen on {addr}: ")),
        "{stderr}"
    );
    // The holder is this test process: the message names it, and so does `check`.
    assert!(
        stderr.contains(&format!("; held by pid {} (", std::process::id())),
        "{stderr}"
    );
    let path = common::temp_config(&text);
    let out = pinlb(&["check", "-c", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "warning: listener[0] {addr} is already listened on by pid {} (",
            std::process::id()
        )),
        "{stdout}"
    );
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_the_process_serving_a_backend_and_warns_when_it_may_share_pinlbs_core() {
    // The "backend" is a pinlb process pinned to one core; its listener is what `check` must
    // trace back to it through /proc.
    let core = common::first_core();
    let mut setup = common::Setup::with(&["127.0.0.1:9".parse().unwrap()]);
    setup.cpus = vec![core];
    let served = common::BinProxy::spawn(&setup).await;

    let config = common::temp_config(&format!(
        "[runtime]\ncpus = [{core}]\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\n\
         [upstream.app]\nbackends = [{{ address = \"{}\" }}, {{ address = \"10.255.255.1:80\" }}]\n",
        served.addr
    ));
    let out = pinlb(&["check", "-c", config.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let pid = served.pid;
    assert!(
        stdout.contains(&format!(
            "  backend {} (upstream app): served by pid {pid} (pinlb), allowed on cores {core}",
            served.addr
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "warning: backend {} is served by pid {pid} (pinlb), allowed on cores {core}, which include pinlb's core {core}",
            served.addr
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("  backend 10.255.255.1:80 (upstream app): not an address of this machine"),
        "a remote backend is said to be invisible, not guessed: {stdout}"
    );
    let _ = std::fs::remove_file(config);
}

#[test]
fn demo_runs_end_to_end_in_a_short_mode() {
    let out = pinlb(&[
        "demo",
        "--duration",
        "300ms",
        "--rounds",
        "1",
        "--connections",
        "4",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("core map:"), "{stdout}");
    assert!(stdout.contains("pinlb 127.0.0.1:"), "{stdout}");
    // Two backends, each with its direct and pinlb rows: every request answered, none failed;
    // pinlb's CPU, its backend's, and its own time from Server-Timing are figures.
    for backend in ["hello-world backend:", "work backend:"] {
        let table = stdout
            .split(backend)
            .nth(2)
            .or_else(|| stdout.split(backend).nth(1))
            .unwrap_or_else(|| panic!("no {backend} table in:\n{stdout}"));
        for target in ["direct", "pinlb"] {
            let row = table
                .lines()
                .find(|l| l.starts_with(&format!("| {target} |")))
                .unwrap_or_else(|| panic!("no {target} row after {backend}:\n{stdout}"));
            assert!(row.ends_with("| 0 |"), "every request answered: {row}");
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            // | name | req/s | × direct | p50 | p99 | proxy CPU | backend CPU | own time | errors |
            assert!(cells[7].parse::<f64>().is_ok(), "backend CPU: {row}");
            if target == "pinlb" {
                assert!(cells[6].parse::<f64>().is_ok(), "pinlb's CPU: {row}");
                assert!(cells[8].contains(" / "), "pinlb's own time: {row}");
            }
        }
    }
    assert!(
        stdout.contains("- pinlb adds ")
            && stdout.contains("% of a backend that spends ")
            && stdout.contains("pinlb's own time per request (Server-Timing): p50 "),
        "{stdout}"
    );
    // The README's sample is what the demo prints: the same table heads and headings.
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    for line in stdout.lines().filter(|l| {
        l.starts_with("| target |") || l.ends_with("backend:") || *l == "what the proxy costs:"
    }) {
        assert!(readme.contains(line), "the README's sample lacks {line:?}");
    }
    // nginx beside it when installed, else a line that says how to add it.
    let nginx = stdout.lines().any(|l| l.starts_with("| nginx |"));
    let told = stdout.contains("note: no nginx row: nginx not found on PATH");
    assert!(nginx != told, "{stdout}");
    assert!(
        !stderr.contains(" INFO "),
        "the in-process proxy and backends keep their start and stop lines out of the results: {stderr}"
    );
}

#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let mut child = Command::new(bin())
        .args(["backend", "--listen", "127.0.0.1:0"])
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let read = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stderr.take().unwrap()),
        &mut first,
    );
    let _ = child.kill();
    let _ = child.wait();
    read.unwrap();
    assert!(first.contains("INFO"), "{first:?}");
    assert!(!first.contains('\x1b'), "{first:?}");
}

/// A fresh empty directory under the target's temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `pinlb ARGS` in `dir`.
fn pinlb_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run pinlb")
}

/// What `check` without `-c` must name: the system's file when the machine has one, else the
/// working directory's.
const SYSTEM_CONFIG: &str = "/etc/pinlb/pinlb.toml";

#[test]
fn check_without_a_file_reads_the_default_and_says_which() {
    let dir = TempDir::new("default-config");
    let valid = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/valid.toml"
    ))
    .unwrap();
    std::fs::write(dir.0.join("pinlb.toml"), valid).unwrap();
    let out = pinlb_in(&dir.0, &["check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = if std::path::Path::new(SYSTEM_CONFIG).exists() {
        SYSTEM_CONFIG
    } else {
        "pinlb.toml"
    };
    assert!(
        stderr.contains(&format!("pinlb: reading {expected} (no -c given)")),
        "{stderr}"
    );
    if expected == "pinlb.toml" {
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("pinlb.toml"));
    }
}

#[test]
fn serve_without_a_file_or_a_default_one_says_where_it_looked() {
    if std::path::Path::new(SYSTEM_CONFIG).exists() {
        // The machine's own file would be read: what is tested here is its absence.
        return;
    }
    let dir = TempDir::new("no-config");
    let out = pinlb_in(&dir.0, &["serve"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "pinlb: no configuration file: give one with -c FILE, or put one at /etc/pinlb/pinlb.toml or ./pinlb.toml"
    );
}

#[test]
fn a_host_name_as_a_listener_is_refused_saying_names_are_not_resolved_there() {
    // Backends may be names (looked up and followed, tests/dns.rs); a listener's address is
    // bound once, so it must be the IP to bind.
    let path = common::temp_config(
        "[[listener]]\naddress = \"localhost:8888\"\nupstream = \"app\"\n\n[upstream.app]\nbackends = [{ address = \"127.0.0.1:8881\" }]\n",
    );
    let out = pinlb(&["check", "-c", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            ".address: invalid address \"localhost:8888\": host names are not resolved; write the IP address and port, such as \"127.0.0.1:8888\" or \"[::1]:8888\""
        ),
        "{stderr}"
    );
}

/// `pinlb import` on every nginx fixture (tests/fixtures/nginx: copies of the project's shared
/// real-world configs, so a clean clone has them): it exits 0, lists what it did not convert
/// with file:line, and (for the fixtures that proxy) writes a configuration `pinlb check`
/// accepts.
#[test]
fn import_converts_the_nginx_fixtures_into_configs_that_check() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nginx");
    let Ok(dir) = std::fs::read_dir(&fixtures) else {
        panic!("the nginx fixtures are at {}", fixtures.display());
    };
    let mut seen = 0;
    for entry in dir {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "conf") {
            continue; // debian/: what debian-default.conf includes.
        }
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pinlb"))
            .arg("import")
            .arg(&path)
            .output()
            .unwrap();
        let proxies = std::fs::read_to_string(&path)
            .unwrap()
            .contains("proxy_pass");
        // One that only serves files is refused (tests/import.rs checks how).
        assert_eq!(
            out.status.success(),
            proxies,
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let notes = String::from_utf8(out.stderr).unwrap();
        // Every line is a note with its file:line, but the refusal's last one.
        for line in notes
            .lines()
            .filter(|l| !l.starts_with("pinlb import: nothing to proxy"))
        {
            let place = line.split(": ").next().unwrap();
            assert!(
                place.rsplit(':').next().unwrap().parse::<usize>().is_ok(),
                "no file:line in {line:?}"
            );
        }
        let toml = String::from_utf8(out.stdout).unwrap();
        let checked = pinlb::Config::parse(
            "imported.toml",
            &toml,
            &pinlb::sys::cpus::allowed_cpus().unwrap(),
        );
        if proxies {
            if let Err(e) = checked {
                panic!("{}: the import does not check: {e}\n{toml}", path.display());
            }
        }
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} fixtures");
}

/// A route's unknown key lists every route key, `path_regex` among them; a `path_regex` that
/// does not compile is refused at its line and column, and a good one is printed by `check` as
/// `~ PATTERN`.
#[test]
fn route_keys_include_path_regex_checked_at_its_place() {
    let config = |route: &str| {
        format!(
            "[[listener]]\naddress = \"127.0.0.1:0\"\n[[listener.route]]\n{route}\nupstream = \"app\"\n[upstream.app]\nbackends = [{{ address = \"127.0.0.1:9001\" }}]\n"
        )
    };
    let check = |text: &str| {
        let path = common::temp_config(text);
        let out = pinlb(&["check", "-c", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).replace(path.to_str().unwrap(), "{file}"),
        )
    };
    let (code, _, stderr) = check(&config("path_regexp = \"php$\""));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "{file}:4:1: listener[0].route[0].path_regexp: unknown field `path_regexp`, expected one of `host`, `path`, `path_exact`, `path_regex`, `methods`, `headers`, `upstream`, `rewrite_prefix`, `redirect`, `respond`, `timeouts`, `rate_limit`, `access`, `auth_basic`, `satisfy`, `request_headers`, `error_page`, `intercept_errors`, `response_headers`, `server_timing`, `compress`, `limit_rate`, `limit_rate_after`, `mirror`, `cache`"
    );
    let (code, _, stderr) = check(&config("path_regex = \"a(\""));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("{file}:4:14: listener[0].route[0].path_regex: invalid regular expression (unclosed group)"),
        "{stderr}"
    );
    let (code, stdout, stderr) = check(&config("path_regex = '\\.php$'"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("path ~ \\.php$ -> upstream app"),
        "{stdout}"
    );
}
