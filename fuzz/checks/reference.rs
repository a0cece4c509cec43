//! Image references as users write them (`--container-image`, `berth pull`).
//! Property: a registry reference printed with Display parses back to the
//! same value (the user name before '@' is not printed, so it is ignored).
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets) and the CI smoke
//! fuzzer (tests/suite/fuzz_smoke.rs).

use berth::reference::ImageSource;

/// Runs one input; panics when a property does not hold.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = ImageSource::parse(input) else {
        return;
    };
    let shown = parsed.to_string();
    if let ImageSource::Registry(r) = parsed {
        let again = match ImageSource::parse(&shown) {
            Ok(ImageSource::Registry(again)) => again,
            other => panic!("{input:?} printed as {shown:?}, which parses as {other:?}"),
        };
        let mut want = r.clone();
        want.user = None;
        assert_eq!(
            again, want,
            "{input:?} printed as {shown:?} does not round-trip"
        );
        let _ = r.api_host();
        let _ = r.manifest_reference();
    }
}
