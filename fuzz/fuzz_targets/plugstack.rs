//! The arguments after `spank_berth.so` in plugstack.conf, split on whitespace.
//! `config=` arguments name a file to read: they are dropped so the fuzzer stays
//! off the file system (the default config file, if present, is still read).
#![no_main]

use berth::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
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
});
