//! cargo-fuzz target: see fuzz/checks/plugstack.rs for what it checks.
#![no_main]

#[path = "../checks/plugstack.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
