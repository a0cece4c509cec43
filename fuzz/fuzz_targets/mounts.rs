//! `--container-mounts` values: SRC[:DST[:FLAGS]][,...].
#![no_main]

use berth::container::spec::parse_mounts;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
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
});
