//! What fuzzing found, kept without a nightly toolchain: each fuzz target's body (the
//! `check` function in `fuzz/targets/TARGET.rs`, which the libFuzzer binary calls too) run over
//! every file in `fuzz/seeds/TARGET/` and `fuzz/regressions/TARGET/`.
//!
//! `fuzz/regressions/TARGET/` holds every input that once broke the target (`fuzz/README.md`
//! says how one gets there), so a fix that comes undone fails here, in plain `cargo test`.

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

#[path = "../fuzz/targets/config.rs"]
mod config;
#[path = "../fuzz/targets/fastcgi.rs"]
mod fastcgi;
#[path = "../fuzz/targets/proxy_protocol.rs"]
mod proxy_protocol;
#[path = "../fuzz/targets/request.rs"]
mod request;

/// Set by any panic in the process. libFuzzer aborts on a panic anywhere, a pinlb worker's
/// tokio task included; tokio would catch that one here, so the replay looks for it instead.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// The files of `fuzz/seeds/TARGET/` and `fuzz/regressions/TARGET/`, sorted; a missing
/// folder holds none.
fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for folder in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(root.join(folder).join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.expect("a readable folder").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Runs `check` on each of `target`'s inputs, naming the file an input failed on.
fn replay(target: &str, check: fn(&[u8])) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            default(info);
        }));
    });
    let files = inputs(target);
    assert!(!files.is_empty(), "no seeds for the {target} target");
    for path in &files {
        let data = std::fs::read(path).expect("a readable input");
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok() && !PANICKED.load(Ordering::SeqCst),
            "the {target} target fails on {}",
            path.display()
        );
    }
}

#[test]
fn the_config_target_passes_its_seeds_and_regressions() {
    replay("config", config::check);
}

#[test]
fn the_fastcgi_target_passes_its_seeds_and_regressions() {
    replay("fastcgi", fastcgi::check);
}

#[test]
fn the_proxy_protocol_target_passes_its_seeds_and_regressions() {
    replay("proxy_protocol", proxy_protocol::check);
}

#[test]
fn the_request_target_passes_its_seeds_and_regressions() {
    replay("request", request::check);
}
