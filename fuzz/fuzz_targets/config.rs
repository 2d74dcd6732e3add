//! libFuzzer's entry for the `config` target; the body and its invariant are in
//! `fuzz/targets/config.rs`, which `tests/fuzz_replay.rs` replays too.

#![no_main]

#[path = "../targets/config.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::check(data));
