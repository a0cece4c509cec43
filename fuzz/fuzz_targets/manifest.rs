//! cargo-fuzz target: see fuzz/checks/manifest.rs for what it checks.
#![no_main]

#[path = "../checks/manifest.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
