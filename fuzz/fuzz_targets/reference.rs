//! cargo-fuzz target: see fuzz/checks/reference.rs for what it checks.
#![no_main]

#[path = "../checks/reference.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
