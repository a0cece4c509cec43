//! Store tests against the in-process fake registry.

use std::io::Write;
use std::sync::Arc;

use super::*;
use crate::image::squashfs::tar2sqfs_available;
use crate::registry::fake::{FakeAuth, FakeRegistry};
use crate::registry::{NoCredentials, RegistryError};

pub(super) fn gz_layer(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data.as_bytes()).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&tar).unwrap();
    enc.finish().unwrap()
}

pub(super) fn options(reg: &FakeRegistry) -> PullOptions {
    PullOptions {
        registry: RegistryOptions {
            insecure_registries: vec![
                reg.addr.clone(),
                format!("localhost:{}", reg.addr.rsplit(':').next().unwrap()),
            ],
            credentials: Arc::new(NoCredentials),
            retry: crate::registry::RetryPolicy {
                initial_delay: std::time::Duration::from_millis(10),
                ..Default::default()
            },
            proxy: crate::registry::ProxySettings::default(),
            ..RegistryOptions::default()
        },
        progress: ProgressMode::Off,
        ..PullOptions::default()
    }
}

pub(super) fn reference(reg: &FakeRegistry, name: &str) -> ImageRef {
    ImageRef::parse(&format!("{}/{name}", reg.addr)).unwrap()
}

pub(super) fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub(super) fn skip_without_tar2sqfs(test: &str) -> bool {
    !tar2sqfs_available()
        && crate::test_support::skip_because(
            test,
            "tar2sqfs is not installed (apt-get install squashfs-tools-ng)",
        )
}

#[test]
fn pull_converts_then_hits_the_store() {
    if skip_without_tar2sqfs("pull_converts_then_hits_the_store") {
        return;
    }
    let reg = FakeRegistry::start(FakeAuth::Bearer { login: None });
    reg.state.lock().unwrap().redirect_blobs = true;
    let digest = reg.push_image(
        "ns/app",
        "v1",
        vec![
            gz_layer(&[("etc/a", "1"), ("etc/b", "1")]),
            gz_layer(&[("etc/.wh.b", ""), ("etc/c", "2")]),
        ],
        &["PATH=/bin", "X=y"],
    );
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/app:v1"));
    let first = pull_image(root.path(), &source, &options(&reg)).unwrap();
    assert_eq!(first.manifest_digest.as_deref(), Some(digest.as_str()));
    assert_eq!(first.config.env, ["PATH=/bin", "X=y"]);
    assert_eq!(
        first.reference.as_ref().unwrap().digest.as_deref(),
        Some(digest.as_str())
    );
    let dir = root.path().join("images").join(digest.hex());
    assert_eq!(first.squashfs, dir.join("image.sqfs"));
    assert_eq!(
        entries(&dir),
        [
            "config.json",
            "image.sqfs",
            "last-used",
            "manifest.json",
            "meta.json"
        ]
    );
    let magic = fs::read(&first.squashfs).unwrap();
    assert_eq!(&magic[..4], SQUASHFS_MAGIC);
    assert_eq!(entries(&root.path().join("blobs/sha256")).len(), 2);
    assert!(entries(&root.path().join("tmp")).is_empty());
    let blob_gets = reg.count("GET /v2/ns/app/blobs/");
    assert_eq!(blob_gets, 3, "config and two layers");

    let listing = std::process::Command::new("unsquashfs")
        .arg("-l")
        .arg(&first.squashfs)
        .output();
    if let Ok(listing) = listing {
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(
            listing.contains("etc/a") && listing.contains("etc/c") && !listing.contains("etc/b"),
            "{listing}"
        );
    }

    // Second pull: the manifest is asked for again, no blob is downloaded.
    let manifests = reg.count("GET /v2/ns/app/manifests/");
    let second = pull_image(root.path(), &source, &options(&reg)).unwrap();
    assert_eq!(second, first);
    assert_eq!(reg.count("GET /v2/ns/app/blobs/"), blob_gets);
    assert!(reg.count("GET /v2/ns/app/manifests/") > manifests);

    let store = Store::open(root.path()).unwrap();
    assert_eq!(
        store
            .lookup_digest(digest.as_str())
            .unwrap()
            .unwrap()
            .squashfs,
        first.squashfs
    );
    let absent = Digest::of_bytes(b"absent");
    assert!(store.lookup_digest(absent.as_str()).unwrap().is_none());
    assert!(store.lookup_digest("sha256:../../etc").is_err());

    // A stored image of another converter version is converted again (blobs reused).
    let meta_path = dir.join("meta.json");
    let mut meta: ImageMeta = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    meta.converter_version = 0;
    fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    assert!(store.lookup_digest(digest.as_str()).unwrap().is_none());
    let third = pull_image(root.path(), &source, &options(&reg)).unwrap();
    assert_eq!(third.squashfs, first.squashfs);
    assert_eq!(
        reg.count("GET /v2/ns/app/blobs/"),
        blob_gets + 1,
        "only the config again"
    );
    assert!(entries(&root.path().join("tmp")).is_empty());
}

#[test]
fn corrupt_blob_leaves_the_store_as_it_was() {
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image("ns/bad", "v1", vec![gz_layer(&[("a", "a")])], &[]);
    let manifest = reg.state.lock().unwrap().log.len(); // nothing yet
    assert_eq!(manifest, 0);
    let client = crate::registry::RegistryClient::new(&options(&reg).registry);
    let resolved = client
        .resolve(&reference(&reg, "ns/bad:v1"), &Platform::current())
        .unwrap();
    let layer = Digest::parse(&resolved.manifest.layers[0].digest).unwrap();
    reg.corrupt_blob(&layer, gz_layer(&[("a", "evil")]));

    let root = tempfile::tempdir().unwrap();
    let err = pull_image(
        root.path(),
        &ImageSource::Registry(reference(&reg, "ns/bad:v1")),
        &options(&reg),
    )
    .unwrap_err();
    let registry_error = err.downcast_ref::<RegistryError>();
    assert!(
        matches!(registry_error, Some(RegistryError::DigestMismatch { .. })),
        "{err:#}"
    );
    assert!(format!("{err:#}").contains(layer.as_str()), "{err:#}");
    assert!(entries(&root.path().join("blobs/sha256")).is_empty());
    assert!(entries(&root.path().join("images")).is_empty());
    assert!(entries(&root.path().join("tmp")).is_empty());
}

#[test]
fn missing_image_is_reported() {
    let reg = FakeRegistry::start(FakeAuth::None);
    let root = tempfile::tempdir().unwrap();
    let err = pull_image(
        root.path(),
        &ImageSource::Registry(reference(&reg, "ns/none:v1")),
        &options(&reg),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not found in registry"), "{err:#}");
}

#[test]
fn squashfs_files() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("img.sqsh");
    fs::write(&good, b"hsqs\0\0\0\0rest").unwrap();
    let img = pull_image(
        Path::new("/nonexistent-store-is-not-needed"),
        &ImageSource::SquashfsFile(good.clone()),
        &PullOptions::default(),
    )
    .unwrap();
    assert_eq!(img.squashfs, fs::canonicalize(&good).unwrap());
    assert_eq!(img.config, ImageConfig::default());
    assert_eq!(img.reference, None);

    let bad = dir.path().join("img.tar");
    fs::write(&bad, b"ustar...").unwrap();
    let e = Store::open_squashfs_file(&bad).unwrap_err().to_string();
    assert!(
        e.contains("not a squashfs image") && e.contains("img.tar"),
        "{e}"
    );
    let e = Store::open_squashfs_file(&dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot open squashfs image"), "{e}");
}

#[test]
fn open_creates_the_layout_and_sweeps() {
    let root = tempfile::tempdir().unwrap();
    let store_root = root.path().join("store");
    let store = Store::open(&store_root).unwrap();
    assert_eq!(entries(&store_root), ["blobs", "images", "locks", "tmp"]);
    assert!(store_root.join("blobs/sha256").is_dir());
    fs::write(store_root.join("tmp/blob-x.999.0"), "partial").unwrap();
    drop(store);
    Store::open(&store_root).unwrap();
    assert!(entries(&store_root.join("tmp")).is_empty());
    let default = Store::default_root();
    assert!(default.ends_with("berth"), "{}", default.display());
}

/// Pulls from a real registry:
/// `BERTH_TEST_IMAGE=127.0.0.1:15900/test/deb:v1 BERTH_TEST_STORE=/tmp/store cargo test --lib real_registry_pull -- --ignored --nocapture`
/// (the registry host is treated as insecure, i.e. plain HTTP).
#[test]
#[ignore]
fn real_registry_pull() {
    let Ok(image) = std::env::var("BERTH_TEST_IMAGE") else {
        eprintln!("set BERTH_TEST_IMAGE to a registry image on a plain-HTTP registry");
        return;
    };
    let store =
        std::env::var("BERTH_TEST_STORE").unwrap_or_else(|_| "/tmp/berth-test-store".into());
    let ImageSource::Registry(r) = ImageSource::parse(&image).unwrap() else {
        panic!("not a registry image")
    };
    let options = PullOptions {
        registry: RegistryOptions {
            insecure_registries: vec![r.registry.clone()],
            ..RegistryOptions::default()
        },
        progress: ProgressMode::Lines,
        ..PullOptions::default()
    };
    let start = std::time::Instant::now();
    let img = pull_image(Path::new(&store), &ImageSource::Registry(r), &options).unwrap();
    eprintln!("{img:#?}\npulled in {:.2?}", start.elapsed());
}

#[test]
fn concurrent_pulls_download_once() {
    if skip_without_tar2sqfs("concurrent_pulls_download_once") {
        return;
    }
    let reg = FakeRegistry::start(FakeAuth::None);
    let digest = reg.push_image(
        "ns/par",
        "v1",
        vec![gz_layer(&[("a", "a")]), gz_layer(&[("b", "b")])],
        &[],
    );
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/par:v1"));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| pull_image(root.path(), &source, &options(&reg)).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results
        .iter()
        .all(|r| r.manifest_digest.as_deref() == Some(digest.as_str())));
    assert_eq!(
        reg.count("GET /v2/ns/par/blobs/"),
        3,
        "config and two layers, once"
    );
    assert!(entries(&root.path().join("tmp")).is_empty());
}

/// A shared store: pulls of one image by several "nodes" fetch each blob
/// once (the lease), a dead puller's lease is taken over, and nothing of a
/// node's own is left in the shared folders.
#[test]
fn shared_store_pulls_once_and_takes_over_a_dead_puller() {
    if skip_without_tar2sqfs("shared_store_pulls_once_and_takes_over_a_dead_puller") {
        return;
    }
    let reg = FakeRegistry::start(FakeAuth::None);
    let digest = reg.push_image(
        "ns/shared",
        "v1",
        vec![gz_layer(&[("a", "a")]), gz_layer(&[("b", "b")])],
        &[],
    );
    let root = tempfile::tempdir().unwrap();
    let settings = super::SharedSettings {
        lease_timeout: std::time::Duration::from_secs(1),
        wait_timeout: std::time::Duration::from_secs(60),
    };
    let shared = || PullOptions {
        shared: Some(settings),
        ..options(&reg)
    };
    // A puller that died holding the lease of this image.
    let store = super::Store::open_shared(root.path(), settings).unwrap();
    let lease = root
        .path()
        .join("leases")
        .join(format!("{}.lease", &digest.as_str()["sha256:".len()..]));
    std::fs::write(
        &lease,
        r#"{"host":"gone","pid":1,"started":0,"token":"dead"}"#,
    )
    .unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/shared:v1"));
    let started = std::time::Instant::now();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| s.spawn(|| pull_image(root.path(), &source, &shared()).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        started.elapsed() >= settings.lease_timeout,
        "the dead lease was waited out"
    );
    assert!(results
        .iter()
        .all(|r| r.manifest_digest.as_deref() == Some(digest.as_str())));
    assert_eq!(
        reg.count("GET /v2/ns/shared/blobs/"),
        3,
        "config and two layers, once for all pullers"
    );
    assert!(store.is_shared());
    assert!(
        entries(&root.path().join("leases")).is_empty(),
        "leases released"
    );
    assert!(entries(&store.tmp_dir()).is_empty(), "no temp files left");
    // gc of a shared store needs an age, and keeps what is younger.
    let e = store.gc(&super::GcOptions::default()).unwrap_err();
    assert!(format!("{e:#}").contains("--min-age"), "{e:#}");
    let report = store
        .gc(&super::GcOptions {
            max_size: Some(0),
            min_age: Some(std::time::Duration::from_secs(3600)),
        })
        .unwrap();
    assert!(report.removed.is_empty(), "{:?}", report.removed);
    assert!(store.lookup_digest(digest.as_str()).unwrap().is_some());
}

#[test]
fn gzip_zstd_and_plain_layers_mix() {
    if skip_without_tar2sqfs("gzip_zstd_and_plain_layers_mix") {
        return;
    }
    let tar = |path: &str, data: &str| {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data.as_bytes()).unwrap();
        b.into_inner().unwrap()
    };
    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image(
        "ns/mixed",
        "v1",
        vec![
            gz_layer(&[("a", "gzip")]),
            zstd::stream::encode_all(&tar("b", "zstd")[..], 3).unwrap(),
            tar("c", "plain"),
        ],
        &[],
    );
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/mixed:v1"));
    let image = pull_image(root.path(), &source, &options(&reg)).unwrap();
    let listing = std::process::Command::new("unsquashfs")
        .arg("-l")
        .arg(&image.squashfs)
        .output();
    if let Ok(listing) = listing {
        let listing = String::from_utf8_lossy(&listing.stdout);
        for file in ["/a", "/b", "/c"] {
            assert!(
                listing.contains(&format!("squashfs-root{file}")),
                "{listing}"
            );
        }
    }
}

#[test]
fn a_broken_layer_download_starts_again() {
    if skip_without_tar2sqfs("a_broken_layer_download_starts_again") {
        return;
    }
    let reg = FakeRegistry::start(FakeAuth::None);
    let layer = gz_layer(&[("big", &"x".repeat(10_000))]);
    let layer_digest = Digest::of_bytes(&layer);
    reg.push_image("ns/flaky", "v1", vec![layer], &[]);
    reg.state.lock().unwrap().truncate_blobs = vec![layer_digest.to_string(); 2];
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/flaky:v1"));
    pull_image(root.path(), &source, &options(&reg)).unwrap();
    assert_eq!(
        reg.count(&format!("GET /v2/ns/flaky/blobs/{layer_digest}")),
        3,
        "two broken answers, then a whole one"
    );
    assert!(entries(&root.path().join("tmp")).is_empty());

    // Bounded: a layer that always breaks fails the pull, naming the layer.
    let reg = FakeRegistry::start(FakeAuth::None);
    let layer = gz_layer(&[("big", &"y".repeat(10_000))]);
    let layer_digest = Digest::of_bytes(&layer);
    reg.push_image("ns/flaky", "v1", vec![layer], &[]);
    reg.state.lock().unwrap().truncate_blobs = vec![layer_digest.to_string(); 10];
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/flaky:v1"));
    let e = pull_image(root.path(), &source, &options(&reg)).unwrap_err();
    assert!(format!("{e:#}").contains(layer_digest.as_str()), "{e:#}");
    assert_eq!(
        reg.count(&format!("GET /v2/ns/flaky/blobs/{layer_digest}")),
        4
    );
    assert!(entries(&root.path().join("tmp")).is_empty());
    assert!(entries(&root.path().join("blobs/sha256")).is_empty());
}

#[test]
fn a_layer_converted_while_it_downloads_survives_a_restart() {
    if skip_without_tar2sqfs("a_layer_converted_while_it_downloads_survives_a_restart") {
        return;
    }
    // Incompressible content, so the compressed layer is several MiB and the
    // conversion reads the first part before the connection breaks.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: Vec<u8> = (0..6 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(big.len() as u64);
    b.append_data(&mut h, "data/big", &big[..]).unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&b.into_inner().unwrap()).unwrap();
    let layer = enc.finish().unwrap();
    let layer_digest = Digest::of_bytes(&layer);

    let reg = FakeRegistry::start(FakeAuth::None);
    reg.push_image("ns/stream", "v1", vec![layer], &[]);
    reg.state.lock().unwrap().truncate_blobs = vec![layer_digest.to_string()];
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/stream:v1"));
    let image = pull_image(root.path(), &source, &options(&reg)).unwrap();
    assert_eq!(
        reg.count(&format!("GET /v2/ns/stream/blobs/{layer_digest}")),
        2
    );
    let out = std::process::Command::new("rdsquashfs")
        .args(["-c", "/data/big"])
        .arg(&image.squashfs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == big,
        "the file in the image differs from the layer's"
    );
    assert!(entries(&root.path().join("tmp")).is_empty());
}

#[test]
fn cached_only_downloads_nothing_and_names_the_digest() {
    if skip_without_tar2sqfs("cached_only_downloads_nothing_and_names_the_digest") {
        return;
    }
    let reg = FakeRegistry::start(FakeAuth::Bearer { login: None });
    let digest = reg.push_image("ns/c", "v1", vec![gz_layer(&[("a", "1")])], &[]);
    let root = tempfile::tempdir().unwrap();
    let source = ImageSource::Registry(reference(&reg, "ns/c:v1"));
    let look = PullOptions {
        cached_only: true,
        ..options(&reg)
    };
    let e = pull_image(root.path(), &source, &look).unwrap_err();
    let missing = e.downcast_ref::<super::NotInStore>().expect("NotInStore");
    assert_eq!(missing.manifest_digest, digest.as_str());
    assert_eq!(reg.count("GET /v2/ns/c/blobs/"), 0, "nothing downloaded");
    let pulled = pull_image(root.path(), &source, &options(&reg)).unwrap();
    let found = pull_image(root.path(), &source, &look).unwrap();
    assert_eq!(found.squashfs, pulled.squashfs);
}

#[test]
fn the_squashfs_level_reaches_the_writer() {
    let reg = FakeRegistry::start(FakeAuth::None);
    // Text that zstd compresses much better at high levels than at level 1.
    let mut words = String::new();
    let mut x: u32 = 7;
    while words.len() < 400_000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        words
            .push_str(["alpha ", "beta ", "gamma ", "delta ", "epsilon\n"][(x >> 16) as usize % 5]);
    }
    reg.push_image(
        "ns/text",
        "v1",
        vec![gz_layer(&[("words.txt", &words)])],
        &[],
    );
    let source = ImageSource::Registry(reference(&reg, "ns/text:v1"));
    let size_at = |level: i32| {
        let root = tempfile::tempdir().unwrap();
        let options = PullOptions {
            zstd_level: level,
            ..options(&reg)
        };
        let stored = pull_image(root.path(), &source, &options).unwrap();
        fs::metadata(&stored.squashfs).unwrap().len()
    };
    let (fast, small) = (size_at(1), size_at(19));
    assert!(
        small < fast,
        "level 19: {small} bytes, level 1: {fast} bytes"
    );
}
