//! libFuzzer's entry for the `fastcgi` target; the body and its invariant are in
//! `fuzz/targets/fastcgi.rs`, which `tests/fuzz_replay.rs` replays too.

#![no_main]

#[path = "../targets/fastcgi.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::check(data));
