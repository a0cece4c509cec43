//! cargo-fuzz target: see fuzz/checks/mounts.rs for what it checks.
#![no_main]

#[path = "../checks/mounts.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
