//! `--container-mounts` values: SRC[:DST[:FLAGS]][,...].
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets) and the CI smoke
//! fuzzer (tests/suite/fuzz_smoke.rs).

use berth::container::spec::parse_mounts;

/// Runs one input; panics when a property does not hold.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    match parse_mounts(input) {
        Ok(mounts) => {
            for m in &mounts {
                // Every accepted destination is absolute and free of '..'.
                assert!(m.target.is_absolute(), "{input:?} gave {m:?}");
                assert!(
                    !m.target
                        .components()
                        .any(|c| c == std::path::Component::ParentDir),
                    "{input:?} gave {m:?}"
                );
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
