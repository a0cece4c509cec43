//! cargo-fuzz target: see fuzz/checks/layer.rs for what it checks.
#![no_main]

#[path = "../checks/layer.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
