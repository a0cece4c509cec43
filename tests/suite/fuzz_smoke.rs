//! A short fuzzing run of every cargo-fuzz target, for CI.
//!
//! The checks are the same functions the cargo-fuzz targets call
//! (fuzz/checks/*.rs). Each target first replays its committed seed corpus
//! (fuzz/seeds/<target>/, which also holds every crash found so far, so a
//! crash stays a regression test), then runs random mutations of the seeds for
//! a few seconds: bit flips, random and "interesting" bytes, inserted and
//! deleted ranges, splices of two seeds. This is blind (no coverage
//! feedback); `tests/fuzz.sh` runs the same checks under libFuzzer for longer
//! runs.
//!
//! Environment: `BERTH_FUZZ_SECONDS` (per target, default 6),
//! `BERTH_FUZZ_SEED` (to replay one run; the seed in use is printed).
//! A failing input is written to target/fuzz-smoke-failures/ and named in the
//! failure message.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "../../fuzz/checks/layer.rs"]
mod layer;
#[path = "../../fuzz/checks/manifest.rs"]
mod manifest;
#[path = "../../fuzz/checks/mounts.rs"]
mod mounts;
#[path = "../../fuzz/checks/plugstack.rs"]
mod plugstack;
#[path = "../../fuzz/checks/reference.rs"]
mod reference;

/// Bytes that often matter to the parsers under test.
const TOKENS: &[&[u8]] = &[
    b"..",
    b"/",
    b"//",
    b":",
    b"#",
    b"@",
    b"\0",
    b"\n",
    b",",
    b"+",
    b"=",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b".wh.",
    b".wh..wh..opq",
    b"sha256:",
    b"docker://",
    b"localhost:5000/",
    b"\xff\xfe",
    b"%n",
    b"ro",
    b"tmpfs",
    b"umount",
    b"mediaType",
    b"manifests",
    b"layers",
];

/// xorshift64*: small, fast, reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Applies one to eight random edits to `input`.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(8) {
        let len = input.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 => {
                let at = rng.below(len + 1);
                let token = TOKENS[rng.below(TOKENS.len())];
                input.splice(at..at, token.iter().copied());
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                input.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(64)).min(len);
                let copy: Vec<u8> = input[start..end].to_vec();
                let at = rng.below(len + 1);
                input.splice(at..at, copy);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(input.len() + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            _ => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
        }
    }
    input.truncate(1 << 20);
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = repo().join("fuzz/seeds").join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read the seed corpus {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no seeds in {}", dir.display());
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

fn save_failure(target: &str, input: &[u8]) -> PathBuf {
    let dir = repo().join("target/fuzz-smoke-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let hash: u64 = input.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{target}-{hash:016x}"));
    std::fs::write(&path, input).unwrap();
    path
}

fn run_target(target: &str, check: fn(&[u8])) {
    let corpus = seeds(target);
    for (i, seed) in corpus.iter().enumerate() {
        if catch_unwind(AssertUnwindSafe(|| check(seed))).is_err() {
            panic!("{target}: committed seed #{i} fails again (a regression)");
        }
    }
    let seconds: u64 = std::env::var("BERTH_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    let seed: u64 = std::env::var("BERTH_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    let mut rng = Rng(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0u64;
    // Panics are expected to be caught here; keep their messages short.
    while Instant::now() < deadline {
        let mut input = corpus[rng.below(corpus.len())].clone();
        mutate(&mut rng, &mut input, &corpus);
        runs += 1;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&input))) {
            let saved = save_failure(target, &input);
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "{target}: input {} fails: {message}\n(BERTH_FUZZ_SEED={seed}; replay with \
                 `RUSTC_BOOTSTRAP=1 cargo fuzz run {target} {}`, then add it to fuzz/seeds/{target}/)",
                saved.display(),
                saved.display()
            );
        }
    }
    eprintln!("{target}: {runs} inputs in {seconds} s (BERTH_FUZZ_SEED={seed})");
    assert!(
        runs > corpus.len() as u64,
        "{target}: the fuzz loop did not run"
    );
}

#[test]
fn fuzz_image_references() {
    run_target("reference", reference::check);
}

#[test]
fn fuzz_mount_specs() {
    run_target("mounts", mounts::check);
}

#[test]
fn fuzz_plugstack_arguments() {
    run_target("plugstack", plugstack::check);
}

#[test]
fn fuzz_manifests_and_indexes() {
    run_target("manifest", manifest::check);
}

#[test]
fn fuzz_layer_reader() {
    run_target("layer", layer::check);
}

#[test]
fn mutations_stay_reproducible() {
    let corpus = vec![b"abc".to_vec()];
    let run = |seed| {
        let mut rng = Rng(seed);
        let mut input = corpus[0].clone();
        mutate(&mut rng, &mut input, &corpus);
        input
    };
    assert_eq!(run(42), run(42));
    assert!(Path::new(&repo().join("fuzz/checks")).is_dir());
}
