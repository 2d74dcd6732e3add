//! libFuzzer's entry for the `proxy_protocol` target; the body and its invariant are in
//! `fuzz/targets/proxy_protocol.rs`, which `tests/fuzz_replay.rs` replays too.

#![no_main]

#[path = "../targets/proxy_protocol.rs"]
mod target;

libfuzzer_sys::fuzz_target!(|data: &[u8]| target::check(data));
