//! Tests of listing, inspecting, holding, removing and collecting images,
//! on stores filled from the in-process fake registry.

use std::fs::{self, File};
use std::time::{Duration, SystemTime};

use super::tests::{entries, gz_layer, options, reference, skip_without_tar2sqfs};
use super::*;
use crate::registry::fake::{FakeAuth, FakeRegistry};

/// A registry with two images sharing their base layer, both pulled into a
/// fresh store: `(registry, store dir, base, app)`.
fn two_images() -> (FakeRegistry, tempfile::TempDir, StoredImage, StoredImage) {
    let reg = FakeRegistry::start(FakeAuth::None);
    let base_layer = gz_layer(&[("etc/os", "base")]);
    reg.push_image("ns/base", "v1", vec![base_layer.clone()], &["A=1"]);
    reg.push_image(
        "ns/app",
        "v2",
        vec![base_layer, gz_layer(&[("app/run", "app")])],
        &["B=2"],
    );
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let base = store
        .pull(&reference(&reg, "ns/base:v1"), &options(&reg))
        .unwrap();
    let app = store
        .pull(&reference(&reg, "ns/app:v2"), &options(&reg))
        .unwrap();
    (reg, root, base, app)
}

fn set_last_used(image: &StoredImage, ago_secs: u64) {
    let file = File::options()
        .write(true)
        .open(image.squashfs.with_file_name("last-used"))
        .unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(ago_secs))
        .unwrap();
}

fn digest_of(image: &StoredImage) -> Digest {
    Digest::parse(image.manifest_digest.as_deref().unwrap()).unwrap()
}

#[test]
fn images_are_listed_and_found() {
    if skip_without_tar2sqfs("images_are_listed_and_found") {
        return;
    }
    let (reg, root, base, app) = two_images();
    let store = Store::open(root.path()).unwrap();
    set_last_used(&base, 3600);
    let images = store.images().unwrap();
    let names: Vec<String> = images.iter().map(ImageEntry::name).collect();
    assert_eq!(
        names,
        [
            format!("{}/ns/app:v2", reg.addr),
            format!("{}/ns/base:v1", reg.addr)
        ],
        "most recently used first"
    );
    assert!(images.iter().all(|i| i.is_current() && i.size > 0));

    let app_digest = digest_of(&app);
    for query in [
        format!("{}/ns/app:v2", reg.addr),
        app_digest.to_string(),
        app_digest.hex()[..8].to_string(),
        format!("sha256:{}", &app_digest.hex()[..12]),
        format!("{}/ns/app@{}", reg.addr, app_digest),
    ] {
        let found = store.find_images(&query).unwrap();
        assert_eq!(found.len(), 1, "{query}");
        assert_eq!(found[0].digest, app_digest, "{query}");
    }
    for query in [format!("{}/ns/app:v1", reg.addr), "ns/app:v2".to_string()] {
        let e = store.find_images(&query).unwrap_err().to_string();
        assert!(e.contains("no image") && e.contains("berth images"), "{e}");
    }
}

#[test]
fn inspect_shows_config_and_layers() {
    if skip_without_tar2sqfs("inspect_shows_config_and_layers") {
        return;
    }
    let (reg, root, _base, app) = two_images();
    let store = Store::open(root.path()).unwrap();
    let entry = store
        .find_images(&format!("{}/ns/app:v2", reg.addr))
        .unwrap();
    let details = entry[0].details().unwrap();
    assert_eq!(details.digest, app.manifest_digest.clone().unwrap());
    assert_eq!(details.squashfs, app.squashfs);
    assert_eq!(details.config.env, ["B=2"]);
    assert_eq!(details.config.cmd, Some(vec!["/bin/sh".to_string()]));
    assert_eq!(details.layers.len(), 2);
    assert!(details
        .layers
        .iter()
        .all(|l| l.media_type.ends_with("tar+gzip") && l.size > 0));
    let json = serde_json::to_value(&details).unwrap();
    assert_eq!(json["config"]["Env"][0], "B=2");
    assert!(json["layers"][0]["media_type"].is_string());
}

#[test]
fn a_held_image_is_not_removed() {
    if skip_without_tar2sqfs("a_held_image_is_not_removed") {
        return;
    }
    let (_reg, root, base, app) = two_images();
    let store = Store::open(root.path()).unwrap();
    let app_entry = store
        .find_images(digest_of(&app).as_str())
        .unwrap()
        .remove(0);
    assert_eq!(entries(&root.path().join("blobs/sha256")).len(), 2);

    let hold = store.hold(&app).unwrap();
    assert_eq!(hold.path(), app.squashfs);
    // A second container may hold it too.
    let hold2 = store.hold(&app).unwrap();
    assert_eq!(
        store.remove_image(&app_entry).unwrap(),
        RemoveOutcome::InUse
    );
    drop(hold);
    assert_eq!(
        store.remove_image(&app_entry).unwrap(),
        RemoveOutcome::InUse
    );
    drop(hold2);

    let RemoveOutcome::Removed {
        image_bytes,
        blobs,
        blobs_kept,
    } = store.remove_image(&app_entry).unwrap()
    else {
        panic!("not removed");
    };
    assert!(image_bytes > 0);
    assert_eq!(
        blobs.len(),
        1,
        "only the app layer; base still uses the other"
    );
    assert_eq!(blobs_kept, None);
    assert!(!app_entry.dir.exists());
    assert_eq!(entries(&root.path().join("blobs/sha256")).len(), 1);
    assert!(entries(&root.path().join("tmp")).is_empty());

    let e = store.hold(&app).unwrap_err().to_string();
    assert!(
        e.contains("was removed") && e.contains("pull it again"),
        "{e}"
    );
    assert!(store.hold(&base).is_ok());
}

#[test]
fn blobs_stay_while_a_pull_runs() {
    if skip_without_tar2sqfs("blobs_stay_while_a_pull_runs") {
        return;
    }
    let (_reg, root, _base, app) = two_images();
    let store = Store::open(root.path()).unwrap();
    let app_entry = store
        .find_images(digest_of(&app).as_str())
        .unwrap()
        .remove(0);
    let pulling = FileLock::shared(&store.store_lock_path()).unwrap();
    let RemoveOutcome::Removed {
        blobs, blobs_kept, ..
    } = store.remove_image(&app_entry).unwrap()
    else {
        panic!("not removed");
    };
    assert!(blobs.is_empty());
    assert!(blobs_kept.unwrap().contains("berth gc"));
    drop(pulling);
    let sweep = store.remove_unused_blobs(None).unwrap();
    assert_eq!(sweep.removed.len(), 1);
    assert_eq!(sweep.skipped, None);
}

#[test]
fn pull_hit_records_last_use() {
    if skip_without_tar2sqfs("pull_hit_records_last_use") {
        return;
    }
    let (reg, root, base, _app) = two_images();
    let store = Store::open(root.path()).unwrap();
    set_last_used(&base, 86_400);
    let before = store.find_images(digest_of(&base).as_str()).unwrap()[0].last_used;
    assert!(before < SystemTime::now() - Duration::from_secs(3600));
    store
        .pull(&reference(&reg, "ns/base:v1"), &options(&reg))
        .unwrap();
    let after = store.find_images(digest_of(&base).as_str()).unwrap()[0].last_used;
    assert!(after > SystemTime::now() - Duration::from_secs(60));
}

#[test]
fn gc_removes_garbage_then_least_recently_used() {
    if skip_without_tar2sqfs("gc_removes_garbage_then_least_recently_used") {
        return;
    }
    let (reg, root, base, app) = two_images();
    reg.push_image("ns/third", "v1", vec![gz_layer(&[("t", "third")])], &[]);
    let store = Store::open(root.path()).unwrap();
    let third = store
        .pull(&reference(&reg, "ns/third:v1"), &options(&reg))
        .unwrap();
    set_last_used(&base, 300);
    set_last_used(&app, 200);
    set_last_used(&third, 100);

    // Garbage: a dead writer's temp file, a broken image folder, a stray blob.
    fs::write(root.path().join("tmp/blob-x.1.1"), "partial").unwrap();
    let broken = root
        .path()
        .join("images")
        .join(Digest::of_bytes(b"x").hex());
    fs::create_dir(&broken).unwrap();
    fs::write(broken.join("image.sqfs"), "half").unwrap();
    let stray = Digest::of_bytes(b"stray");
    fs::write(store.blob_path(&stray), "stray").unwrap();

    let report = store.gc(&GcOptions::default()).unwrap();
    let what: Vec<String> = report.removed.iter().map(|(r, _)| r.to_string()).collect();
    assert_eq!(report.removed.len(), 3, "{what:?}");
    assert!(matches!(report.removed[0].0, Removed::Temp(_)), "{what:?}");
    assert_eq!(report.removed[1].0, Removed::Broken(broken.clone()));
    assert_eq!(report.removed[2].0, Removed::Blob(stray));
    assert!(report.freed() > 0 && report.size_after < report.size_before);
    assert_eq!(store.images().unwrap().len(), 3);

    // Budget: the least recently used (base) must go; it is held, so app goes.
    let hold = store.hold(&base).unwrap();
    let entries_now = store.images().unwrap();
    let third_size = entries_now
        .iter()
        .find(|i| i.digest == digest_of(&third))
        .unwrap()
        .size;
    let budget = store.disk_usage() - 1;
    let report = store
        .gc(&GcOptions {
            max_size: Some(budget),
            min_age: None,
        })
        .unwrap();
    let removed_images: Vec<&Removed> = report
        .removed
        .iter()
        .map(|(r, _)| r)
        .filter(|r| matches!(r, Removed::Image { .. }))
        .collect();
    assert_eq!(removed_images.len(), 1, "{report:?}");
    let Removed::Image { digest, .. } = removed_images[0] else {
        unreachable!()
    };
    assert_eq!(*digest, digest_of(&app));
    assert_eq!(report.in_use.len(), 1);
    assert!(report.in_use[0].contains("ns/base:v1"));
    assert!(report.size_after <= budget);
    assert!(base.squashfs.exists() && third.squashfs.exists());

    // A budget nothing can meet: everything unheld goes, the held image stays.
    let report = store
        .gc(&GcOptions {
            max_size: Some(0),
            min_age: None,
        })
        .unwrap();
    assert!(
        report.notes.iter().any(|n| n.contains("in use")),
        "{report:?}"
    );
    assert!(!third.squashfs.exists() && base.squashfs.exists());
    assert!(third_size > 0);
    drop(hold);
    let report = store
        .gc(&GcOptions {
            max_size: Some(0),
            min_age: None,
        })
        .unwrap();
    assert_eq!(report.size_after, 0, "{report:?}");
    assert!(store.images().unwrap().is_empty());
    assert!(entries(&root.path().join("blobs/sha256")).is_empty());
}

#[test]
fn gc_removes_images_of_older_converters() {
    if skip_without_tar2sqfs("gc_removes_images_of_older_converters") {
        return;
    }
    let (_reg, root, base, _app) = two_images();
    let store = Store::open(root.path()).unwrap();
    let meta_path = base.squashfs.with_file_name("meta.json");
    let mut meta: ImageMeta = serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    meta.converter_version = 0;
    fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let report = store.gc(&GcOptions::default()).unwrap();
    assert!(
        matches!(&report.removed[0].0, Removed::Image { outdated: true, digest, .. } if *digest == digest_of(&base)),
        "{report:?}"
    );
    assert_eq!(store.images().unwrap().len(), 1);
}
