//! Arbitrary bytes as a config file: `Config::parse` must never panic, and every error it
//! returns must point inside the text as `fuzz.toml:LINE:COL: `.

#![no_main]

use libfuzzer_sys::fuzz_target;

/// A fixed core set, so that the outcome does not depend on the machine.
const ALLOWED: &[usize] = &[0, 1, 2, 3];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match pinlb::Config::parse("fuzz.toml", text, ALLOWED) {
        // A valid plan must also describe itself (`pinlb check`) without panicking.
        Ok(config) => drop(pinlb::tools::check::describe(&config)),
        Err(e) => {
            let shown = e.to_string();
            let prefix = format!("fuzz.toml:{}:{}: ", e.line, e.col);
            assert!(shown.starts_with(&prefix), "{shown:?} lacks {prefix:?}");
            // Lines and columns are 1-based and inside the text (one past the end at most).
            let lines: Vec<&str> = text.split('\n').collect();
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
});
