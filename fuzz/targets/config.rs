//! Arbitrary bytes as a config file: `Config::parse` must never panic, and every error it
//! returns must point inside the text as `fuzz.toml:LINE:COL: `.
//!
//! The body of the `config` fuzz target (`fuzz/fuzz_targets/config.rs`), also replayed over
//! `fuzz/seeds/config/` and `fuzz/regressions/config/` by `tests/fuzz_replay.rs`.

/// A fixed core set, so that the outcome does not depend on the machine.
const ALLOWED: &[usize] = &[0, 1, 2, 3];

/// Panics when `data` breaks the target's invariant.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match pinlb::Config::parse("fuzz.toml", text, ALLOWED) {
        // A valid plan must also describe itself (`pinlb check`) without panicking.
        Ok(config) => drop(pinlb_tools::check::describe(&config)),
        Err(all) => {
            let errors = all.errors();
            assert!(!errors.is_empty(), "an error list with no error");
            // `check` prints them in file order, one line each, so that the first line is the
            // first place to fix.
            assert!(
                errors
                    .windows(2)
                    .all(|w| (w[0].line, w[0].col) <= (w[1].line, w[1].col)),
                "errors out of file order: {all}"
            );
            let lines: Vec<&str> = text.split('\n').collect();
            for e in errors {
                let shown = e.to_string();
                let prefix = format!("fuzz.toml:{}:{}: ", e.line, e.col);
                assert!(shown.starts_with(&prefix), "{shown:?} lacks {prefix:?}");
                // Lines and columns are 1-based and inside the text (one past the end at most).
                assert!(
                    e.line >= 1 && e.line <= lines.len(),
                    "line {} of {}: {shown}",
                    e.line,
                    lines.len()
                );
                let cols = lines[e.line - 1].chars().count() + 1;
                assert!(
                    e.col >= 1 && e.col <= cols,
                    "col {} of {cols}: {shown}",
                    e.col
                );
            }
        }
    }
}
