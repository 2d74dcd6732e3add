//! libFuzzer's entry for the `request` target; the body and its invariant are in
//! `fuzz/targets/request.rs`, which `tests/fuzz_replay.rs` replays too.

#![no_main]

#[path = "../targets/request.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::check(data));
