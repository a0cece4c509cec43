//! The layer reader: tar (plain, gzip or zstd) with OCI whiteouts, flattened
//! over 1-3 layers in one pass, top layer first (`write_flattened` into a sink).
//! The input is split into layers at each SEPARATOR (at most 3 layers).
//! Also checks `normalize` on every raw chunk.
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets) and the CI smoke
//! fuzzer (tests/suite/fuzz_smoke.rs).

use berth::image::flatten;
use berth::image::Layer;

const SEPARATOR: &[u8] = b"\n--berth-layer--\n";

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while parts.len() < 2 {
        match rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + SEPARATOR.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts
}

/// Runs one input; panics when a property does not hold.
pub fn check(data: &[u8]) {
    // normalize: never keeps a '..' component, a NUL, or a leading '/'.
    if let Ok(n) = flatten::normalize(data) {
        assert!(!n.starts_with(b"/"));
        assert!(!n.contains(&0));
        assert!(
            !n.split(|b| *b == b'/')
                .any(|c| c == b".." || c == b"." || c.is_empty())
                || n.is_empty()
        );
    }
    let layers: Vec<Layer> = split(data)
        .into_iter()
        .enumerate()
        .map(|(i, bytes)| Layer::from_bytes(bytes.to_vec(), format!("layer{i}")))
        .collect();
    let _ = flatten::write_flattened(&layers, std::io::sink(), |_| {});
}
