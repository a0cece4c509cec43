//! `berth images`, `inspect`, `rmi` and `gc` run as a real process on a store
//! laid out by this test with the library's own types (the pull path that
//! normally fills a store is tested in the library's unit tests).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use berth::image::{ImageConfig, CONVERTER_VERSION};
use berth::registry::{Descriptor, Digest, ImageManifest};
use berth::store::{ImageMeta, Store};

struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

fn berth(store: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .arg("--store")
        .arg(store)
        .env("BERTH_CONFIG", "/dev/null")
        .output()
        .expect("run berth");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes a blob and returns its layer descriptor.
fn blob(store: &Store, content: &[u8]) -> Descriptor {
    let digest = Digest::of_bytes(content);
    fs::write(store.blob_path(&digest), content).unwrap();
    Descriptor {
        media_type: "application/vnd.oci.image.layer.v1.tar+gzip".to_string(),
        digest: digest.to_string(),
        size: content.len() as u64,
        platform: None,
        urls: Vec::new(),
    }
}

/// Lays out one image as a pull would; returns its manifest digest.
fn add_image(
    store: &Store,
    repo_tag: &str,
    layers: &[Descriptor],
    sqfs_bytes: usize,
    age_secs: u64,
) -> Digest {
    let (repository, tag) = repo_tag.split_once(':').unwrap();
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some("application/vnd.oci.image.manifest.v1+json".to_string()),
        config: Descriptor {
            media_type: "application/vnd.oci.image.config.v1+json".to_string(),
            digest: Digest::of_bytes(repo_tag.as_bytes()).to_string(),
            size: 10,
            platform: None,
            urls: Vec::new(),
        },
        layers: layers.to_vec(),
    };
    let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
    let digest = Digest::of_bytes(&manifest_bytes);
    let dir = store.image_dir(&digest);
    fs::create_dir(&dir).unwrap();
    let mut sqfs = b"hsqs".to_vec();
    sqfs.resize(sqfs_bytes, 0);
    fs::write(dir.join("image.sqfs"), sqfs).unwrap();
    fs::write(dir.join("manifest.json"), &manifest_bytes).unwrap();
    let config = ImageConfig {
        env: vec![format!("IMAGE={repository}")],
        cmd: Some(vec!["/bin/sh".to_string()]),
        working_dir: Some("/work".to_string()),
        ..ImageConfig::default()
    };
    fs::write(
        dir.join("config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let created = SystemTime::now() - Duration::from_secs(age_secs);
    let meta = ImageMeta {
        registry: "registry.example.org".to_string(),
        repository: repository.to_string(),
        tag: Some(tag.to_string()),
        manifest_digest: digest.to_string(),
        index_digest: None,
        platform: None,
        layers: layers.iter().map(|l| l.digest.clone()).collect(),
        compressed_size: layers.iter().map(|l| l.size).sum(),
        anonymous: false,
        origins: Vec::new(),
        user_file: false,
        squashfs_size: sqfs_bytes as u64,
        converter_version: CONVERTER_VERSION,
        created: created
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    };
    fs::write(dir.join("meta.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
    File::create(dir.join("last-used"))
        .unwrap()
        .set_modified(created)
        .unwrap();
    digest
}

/// A store with `old/base:1` (oldest) and `new/app:2`, sharing one layer.
fn store_with_two_images() -> (tempfile::TempDir, PathBuf, Store, Digest, Digest) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let store = Store::open(&root).unwrap();
    let shared = blob(&store, b"shared layer");
    let own = blob(&store, b"app layer");
    let base = add_image(
        &store,
        "old/base:1",
        std::slice::from_ref(&shared),
        4096,
        7200,
    );
    let app = add_image(&store, "new/app:2", &[shared, own], 8192, 60);
    (tmp, root, store, base, app)
}

fn blob_count(root: &Path) -> usize {
    fs::read_dir(root.join("blobs/sha256")).unwrap().count()
}

#[test]
fn images_lists_the_store() {
    let (_tmp, root, _store, base, app) = store_with_two_images();
    let out = berth(&root, &["images"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    for column in ["REFERENCE", "DIGEST", "SIZE", "CREATED", "LAST USED"] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert!(
        lines[1].starts_with("registry.example.org/new/app:2 "),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains(&app.hex()[..12]) && !lines[1].contains(&app.hex()[..13]));
    assert!(lines[1].contains("KiB"), "{}", lines[1]);
    assert!(lines[2].contains("old/base:1") && lines[2].contains(&base.hex()[..12]));

    let empty = tempfile::tempdir().unwrap();
    let out = berth(empty.path(), &["images"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 1, "header only: {}", out.stdout);
}

#[test]
fn inspect_prints_json() {
    let (_tmp, root, _store, _base, app) = store_with_two_images();
    for query in [
        "registry.example.org/new/app:2",
        &app.hex()[..8],
        app.as_str(),
    ] {
        let out = berth(&root, &["inspect", query]);
        assert_eq!(out.code, 0, "{query}: {}", out.stderr);
        let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(json["digest"], app.as_str());
        assert_eq!(json["reference"], "registry.example.org/new/app:2");
        assert_eq!(json["config"]["Env"][0], "IMAGE=new/app");
        assert_eq!(json["config"]["WorkingDir"], "/work");
        assert_eq!(json["config"]["Cmd"][0], "/bin/sh");
        assert_eq!(json["layers"].as_array().unwrap().len(), 2);
        assert_eq!(json["layers"][1]["size"], 9);
        assert!(json["squashfs"].as_str().unwrap().ends_with("image.sqfs"));
        assert!(json["size"].as_u64().unwrap() >= 8192);
    }
    let out = berth(&root, &["inspect", "registry.example.org/new/app:3"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("no image") && out.stderr.contains("berth images"),
        "{}",
        out.stderr
    );
}

#[test]
fn rmi_refuses_an_image_in_use() {
    let (_tmp, root, store, base, app) = store_with_two_images();
    let stored = store.lookup_digest(app.as_str()).unwrap().unwrap();
    let hold = store.hold(&stored).unwrap();
    let out = berth(&root, &["rmi", "registry.example.org/new/app:2"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("in use by a running container"),
        "{}",
        out.stderr
    );
    assert!(stored.squashfs.exists());
    assert_eq!(blob_count(&root), 2);

    drop(hold);
    let out = berth(&root, &["rmi", &app.hex()[..10]]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("removed registry.example.org/new/app:2"),
        "{}",
        out.stdout
    );
    assert!(!stored.squashfs.exists());
    assert_eq!(blob_count(&root), 1, "the shared layer stays for old/base");

    // Several names; a missing one is reported, the others still go.
    let out = berth(&root, &["rmi", "nothere:1", base.as_str()]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("no image 'nothere:1'"),
        "{}",
        out.stderr
    );
    assert_eq!(blob_count(&root), 0);
    assert!(store.images().unwrap().is_empty());
}

#[test]
fn gc_fits_the_budget_in_last_use_order() {
    let (_tmp, root, store, base, app) = store_with_two_images();
    fs::write(root.join("tmp/blob-dead.1.1"), "partial").unwrap();
    let budget = store.disk_usage() - 1000; // more than the temp file frees
    let out = berth(&root, &["gc", "--max-size", &budget.to_string()]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("removed temp"), "{}", out.stdout);
    assert!(
        out.stdout.contains(&format!(
            "removed image registry.example.org/old/base:1 ({base})"
        )),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("freed "), "{}", out.stdout);
    assert!(store.lookup_digest(base.as_str()).unwrap().is_none());
    assert!(store.lookup_digest(app.as_str()).unwrap().is_some());

    let stored = store.lookup_digest(app.as_str()).unwrap().unwrap();
    let _hold = store.hold(&stored).unwrap();
    let out = berth(&root, &["gc", "--max-size", "0"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("kept registry.example.org/new/app:2"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("over the budget"), "{}", out.stderr);
    assert!(stored.squashfs.exists());

    let out = berth(&root, &["gc", "--max-size", "12X"]);
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("invalid size '12X'"), "{}", out.stderr);
}
