//! The arguments after `spank_berth.so` in plugstack.conf, split on whitespace.
//! `config=` arguments name a file to read: they are dropped so the fuzzer stays
//! off the file system (the default config file, if present, is still read).
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets) and the CI smoke
//! fuzzer (tests/suite/fuzz_smoke.rs).

use berth::config::Config;

/// Runs one input; panics when a property does not hold.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = input
        .split_whitespace()
        .filter(|a| !a.starts_with("config="))
        .map(str::to_string)
        .collect();
    match Config::from_plugstack_args(&args) {
        Ok(config) => {
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
