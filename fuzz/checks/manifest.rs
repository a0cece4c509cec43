//! Manifests and indexes as a registry returns them. The first byte picks the
//! response's Content-Type; the rest is the body.
//!
//! Shared by the cargo-fuzz target (fuzz/fuzz_targets) and the CI smoke
//! fuzzer (tests/suite/fuzz_smoke.rs).

use berth::registry::manifest::{self, Manifest};
use berth::registry::Platform;

const CONTENT_TYPES: &[Option<&str>] = &[
    None,
    Some(manifest::DOCKER_MANIFEST),
    Some(manifest::DOCKER_MANIFEST_LIST),
    Some(manifest::OCI_MANIFEST),
    Some(manifest::OCI_INDEX),
    Some(manifest::DOCKER_SCHEMA1),
    Some(manifest::DOCKER_SCHEMA1_SIGNED),
    Some("application/json; charset=utf-8"),
    Some("text/plain"),
    Some("application/vnd.example.artifact+json"),
];

/// Runs one input; panics when a property does not hold.
pub fn check(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[selector as usize % CONTENT_TYPES.len()];
    match Manifest::parse(body, content_type, "fuzz/image") {
        Ok(Manifest::Index(index)) => {
            let _ = index.select(&Platform::current(), "fuzz/image");
        }
        Ok(other) => {
            let _ = format!("{other:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
