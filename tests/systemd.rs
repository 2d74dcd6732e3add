//! systemd: the readiness protocol pinlb speaks on `$NOTIFY_SOCKET` (received here on a real
//! unix datagram socket, as systemd would), and the unit file, checked by `systemd-analyze
//! verify`.

use crate::common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::net::UnixDatagram;

/// The next notification, bounded by [`WAIT`].
async fn next(sock: &UnixDatagram) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, sock.recv(&mut buf))
        .await
        .expect("a notification within the wait limit")
        .expect("recv");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn has(message: &str, line: &str) -> bool {
    message.lines().any(|l| l == line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinlb_tells_systemd_when_it_is_ready_reloading_handed_over_and_stopping() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let notify = dir.join(format!("notify-{}.sock", std::process::id()));
    let upgrade_socket = dir.join(format!("notify-up-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&notify);
    let sock = UnixDatagram::bind(&notify).expect("bind the notify socket");
    let backend = Backend::start("b").await;
    let toml = Setup::with(&[backend.addr]).toml().replacen(
        "[runtime]\n",
        &format!(
            "[runtime]\nupgrade_socket = \"{}\"\n",
            upgrade_socket.display()
        ),
        1,
    );
    let proxy = BinProxy::spawn_toml(&toml, &[("NOTIFY_SOCKET", notify.as_os_str())]).await;

    // READY=1 comes once the port accepts: a request right after it is answered.
    let ready = next(&sock).await;
    assert!(has(&ready, "READY=1"), "{ready:?}");
    assert!(ready.contains("STATUS=serving on "), "{ready:?}");
    assert_eq!(get(proxy.addr, "/").await.status, 200);

    // A SIGHUP reload: RELOADING=1 with the monotonic clock's time, then READY=1.
    proxy.signal(nix::sys::signal::Signal::SIGHUP);
    let reloading = next(&sock).await;
    assert!(has(&reloading, "RELOADING=1"), "{reloading:?}");
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading:?}");
    let reloaded = next(&sock).await;
    assert!(has(&reloaded, "READY=1"), "{reloaded:?}");
    assert!(has(&reloaded, "STATUS=reloaded"), "{reloaded:?}");

    // An upgrade: the old process (the main PID) names the new one, which sends no READY of
    // its own (systemd would refuse it from a PID that is not the main one yet).
    let out = tokio::task::spawn_blocking({
        let config = proxy.config_path().clone();
        move || {
            Command::new(bin())
                .args(["upgrade", "-c"])
                .arg(config)
                .stdin(Stdio::null())
                .output()
                .expect("run pinlb upgrade")
        }
    });
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("pinlb upgrade finished")
        .expect("its thread");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let new_pid: i32 = text
        .strip_prefix("upgraded: pid ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{text:?}"));
    let handed = next(&sock).await;
    assert!(has(&handed, &format!("MAINPID={new_pid}")), "{handed:?}");

    // SIGTERM to the new main PID: STOPPING=1, from it (the old one, handed over, said none).
    let new = nix::unistd::Pid::from_raw(new_pid);
    nix::sys::signal::kill(new, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let stopping = next(&sock).await;
    assert!(has(&stopping, "STOPPING=1"), "{stopping:?}");
    let gone = poll(250, Duration::from_millis(20), async || {
        let stat = std::fs::read_to_string(format!("/proc/{new_pid}/stat")).unwrap_or_default();
        (stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z'))
        .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the new process stops on SIGTERM");
    drop(proxy);
    let _ = std::fs::remove_file(&notify);
}

#[test]
fn the_unit_file_passes_systemd_analyze_verify() {
    let analyze = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(analyze) = analyze else {
        // scripts/test installs Debian's `systemd` package, which has it; only a machine where
        // that could not be installed gets here.
        eprintln!("skipped: systemd-analyze is not installed (Debian package `systemd`)");
        return;
    };
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/systemd/pinlb.service"
    ))
    .expect("read deploy/systemd/pinlb.service");
    // The unit as shipped, but for where the binary is: verify checks that it exists.
    assert!(unit.contains("ExecStart=/usr/local/bin/pinlb serve -c /etc/pinlb/pinlb.toml"));
    for key in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=\n",
    ] {
        assert!(unit.contains(key), "the unit lacks {key:?}");
    }
    assert!(!unit.contains("\nCPUAffinity="), "pinning is the config's");
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let copy = dir.join("pinlb.service");
    std::fs::write(&copy, unit.replace("/usr/local/bin/pinlb", bin())).expect("write the copy");
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("run systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    // verify prints its complaints (unknown keys, bad values) and may still exit 0.
    assert!(
        !stderr.contains("pinlb.service:"),
        "systemd-analyze verify found problems: {stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
