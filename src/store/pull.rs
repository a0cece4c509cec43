//! One pull: resolve, check the store, lock, download blobs in parallel,
//! convert, publish.

use std::fs;
use std::io::BufWriter;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::catalog::{touch_last_used, LAST_USED};
use super::fsutil::{sync_dir, write_synced, FileLock, TempEntry};
use super::{ImageMeta, Store, StoredImage};
use crate::image::{self, ImageConfig, Layer, SquashfsOptions, CONVERTER_VERSION};
use crate::reference::ImageRef;
use crate::registry::{
    Descriptor, Digest, Platform, RegistryClient, RegistryError, ResolvedImage, RetryPolicy,
};

use super::PullOptions;

/// Blobs downloaded at the same time.
const PARALLEL_DOWNLOADS: usize = 4;

/// Layer media types berth can read (compression is detected from content).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
];

/// Config media types of container images.
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

struct Progress(bool);

impl Progress {
    fn say(&self, msg: impl AsRef<str>) {
        if self.0 {
            eprintln!("berth: {}", msg.as_ref());
        }
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

pub(super) fn pull(store: &Store, image: &ImageRef, options: &PullOptions) -> Result<StoredImage> {
    let progress = Progress(options.progress);
    let client = RegistryClient::new(&options.registry);
    progress.say(format!("resolving {image}"));
    let resolved = client.resolve(image, &Platform::current())?;
    let digest = resolved.manifest_digest.clone();
    if let Some(found) = store.load(&digest)? {
        progress.say(format!("{image} ({digest}) is already in the store"));
        touch_last_used(&store.image_dir(&digest));
        return Ok(with_reference(found, &resolved));
    }

    let lock_path = store.locks_dir().join(format!("{}.lock", digest.hex()));
    let _lock = FileLock::exclusive(&lock_path, || {
        progress.say(format!("waiting for another pull of {digest}"))
    })?;
    if let Some(found) = store.load(&digest)? {
        progress.say(format!("{image} ({digest}) was pulled meanwhile"));
        touch_last_used(&store.image_dir(&digest));
        return Ok(with_reference(found, &resolved));
    }
    // Blobs found in the store below must stay until the conversion is done.
    let _downloading = FileLock::shared(&store.store_lock_path())?;

    check_media_types(image, &resolved)?;
    let config_desc = &resolved.manifest.config;
    let config_digest = parse_digest(image, &config_desc.digest)?;
    let config_bytes = client
        .fetch_blob_bytes(image, &config_digest, config_desc.size)
        .with_context(|| format!("cannot fetch the configuration of {image}"))?;
    let config = ImageConfig::from_oci_json(&config_bytes).with_context(|| {
        format!("the image configuration {config_digest} of {image} is not valid JSON")
    })?;

    let layers = &resolved.manifest.layers;
    let total: u64 = layers.iter().map(|l| l.size).sum();
    progress.say(format!("fetching {} layers ({})", layers.len(), mb(total)));
    let started = Instant::now();
    let blob_paths = download_layers(
        store,
        &client,
        image,
        layers,
        options.registry.retry,
        &progress,
    )?;
    progress.say(format!("layers fetched in {:.1?}", started.elapsed()));

    progress.say("converting to squashfs");
    let layer_list: Vec<Layer> = blob_paths
        .into_iter()
        .zip(layers)
        .map(|(path, desc)| Layer::from_file(path, desc.digest.clone()))
        .collect();
    let staging = TempEntry::dir(&store.tmp_dir(), &format!("image-{}", digest.hex()), 0o755)?;
    let sqfs = staging.path().join("image.sqfs");
    let stats = image::convert(&layer_list, &sqfs, &SquashfsOptions::default())
        .with_context(|| format!("cannot convert {image} to squashfs"))?;
    for w in &stats.warnings {
        eprintln!("berth: warning: {image}: {w}");
    }
    progress.say(format!(
        "converted {} files, {} of data, into a {} squashfs in {:.1?}",
        stats.paths,
        mb(stats.bytes),
        mb(stats.image_size),
        stats.total_time
    ));

    let meta = ImageMeta {
        registry: image.registry.clone(),
        repository: image.repository.clone(),
        tag: image.tag.clone(),
        manifest_digest: digest.to_string(),
        index_digest: resolved.index_digest.as_ref().map(ToString::to_string),
        platform: resolved.platform.clone(),
        layers: layers.iter().map(|l| l.digest.clone()).collect(),
        compressed_size: total,
        squashfs_size: stats.image_size,
        converter_version: CONVERTER_VERSION,
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    write_synced(
        &staging.path().join("config.json"),
        &serde_json::to_vec_pretty(&config)?,
    )?;
    write_synced(
        &staging.path().join("manifest.json"),
        &resolved.manifest_bytes,
    )?;
    write_synced(
        &staging.path().join("meta.json"),
        &serde_json::to_vec_pretty(&meta)?,
    )?;
    write_synced(&staging.path().join(LAST_USED), b"")?;
    sync_dir(staging.path())?;
    publish(store, staging, &digest)?;
    progress.say(format!("{image} is ready ({digest})"));
    let stored = store
        .load(&digest)?
        .with_context(|| format!("image {digest} vanished from the store right after its pull"))?;
    Ok(with_reference(stored, &resolved))
}

/// The stored image, with the reference the user asked for (pinned).
fn with_reference(mut stored: StoredImage, resolved: &ResolvedImage) -> StoredImage {
    stored.reference = Some(resolved.image.clone());
    stored
}

fn parse_digest(image: &ImageRef, digest: &str) -> Result<Digest> {
    Digest::parse(digest).map_err(|detail| {
        RegistryError::InvalidManifest {
            image: image.to_string(),
            detail,
        }
        .into()
    })
}

fn check_media_types(image: &ImageRef, resolved: &ResolvedImage) -> Result<()> {
    let config_type = resolved.manifest.config.media_type.as_str();
    if !config_type.is_empty() && !CONFIG_TYPES.contains(&config_type) {
        return Err(RegistryError::UnsupportedManifest {
            image: image.to_string(),
            media_type: config_type.to_string(),
            hint: "this is not a container image (an OCI artifact?)".to_string(),
        }
        .into());
    }
    for layer in &resolved.manifest.layers {
        let t = layer.media_type.as_str();
        if !t.is_empty() && !LAYER_TYPES.contains(&t) {
            return Err(RegistryError::UnsupportedManifest {
                image: image.to_string(),
                media_type: t.to_string(),
                hint: format!(
                    "layer {} has a media type berth cannot unpack (foreign or \
                     non-distributable layers are not supported)",
                    layer.digest
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// Downloads the blobs not yet in the store, up to [`PARALLEL_DOWNLOADS`] at a
/// time; returns their paths in layer order.
fn download_layers(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    layers: &[Descriptor],
    retry: RetryPolicy,
    progress: &Progress,
) -> Result<Vec<std::path::PathBuf>> {
    let digests = layers
        .iter()
        .map(|l| parse_digest(image, &l.digest))
        .collect::<Result<Vec<_>>>()?;
    let next = Mutex::new(0usize);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<()>>>> =
        Mutex::new((0..layers.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL_DOWNLOADS.min(layers.len()) {
            s.spawn(|| loop {
                if failed.load(Ordering::Relaxed) {
                    return;
                }
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    let i = *n;
                    *n += 1;
                    i
                };
                if i >= layers.len() {
                    return;
                }
                let r = fetch_blob(
                    store,
                    client,
                    image,
                    &digests[i],
                    layers[i].size,
                    retry,
                    progress,
                );
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    for r in results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
    {
        r?;
    }
    if failed.load(Ordering::Relaxed) {
        bail!("a layer download of {image} failed");
    }
    Ok(digests.iter().map(|d| store.blob_path(d)).collect())
}

/// Fetches one blob into `blobs/` via a locked temp file, verified. A
/// connection lost in the middle of the body starts the blob again, as often
/// as `retry` allows (the request itself is retried by the client).
fn fetch_blob(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    digest: &Digest,
    size: u64,
    retry: RetryPolicy,
    progress: &Progress,
) -> Result<()> {
    let dest = store.blob_path(digest);
    if fs::metadata(&dest).is_ok_and(|m| m.len() == size) {
        progress.say(format!(
            "layer {digest} ({}) already in the store",
            mb(size)
        ));
        return Ok(());
    }
    let mut attempt = 1;
    loop {
        match download_blob(store, client, image, digest, size) {
            Ok(()) => break,
            Err(e) if connection_lost(&e) => {
                // Each try may run for minutes: bound by tries, not by total time.
                let Some(wait) = retry.delay(attempt, None, Duration::ZERO) else {
                    return Err(e);
                };
                eprintln!(
                    "berth: {e:#}; downloading layer {digest} again in {:.1} s (attempt {} of {})",
                    wait.as_secs_f64(),
                    attempt + 1,
                    retry.attempts
                );
                std::thread::sleep(wait);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
    progress.say(format!("layer {digest} ({}) fetched", mb(size)));
    Ok(())
}

/// Whether `e` is a registry connection that broke (worth another try).
fn connection_lost(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<RegistryError>(),
        Some(RegistryError::Unreachable { .. })
    )
}

/// One try of [`fetch_blob`]: download into a temp file, then rename.
fn download_blob(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    digest: &Digest,
    size: u64,
) -> Result<()> {
    let dest = store.blob_path(digest);
    let (tmp, file) = TempEntry::file(&store.tmp_dir(), &format!("blob-{}", digest.hex()))?;
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    client.fetch_blob(image, digest, Some(size), &mut writer)?;
    let file = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    file.sync_all()
        .with_context(|| format!("cannot sync {}", tmp.path().display()))?;
    fs::rename(tmp.path(), &dest)
        .with_context(|| format!("cannot move {} to {}", tmp.path().display(), dest.display()))?;
    tmp.keep();
    Ok(())
}

/// Renames the staged image directory into `images/`, replacing an image made
/// by another converter version.
fn publish(store: &Store, staging: TempEntry, digest: &Digest) -> Result<()> {
    let dest = store.image_dir(digest);
    if dest.exists() {
        // An older conversion (the lock is held, and load() refused it): move it
        // aside atomically, then remove it. Mounted copies stay valid.
        let old = TempEntry::dir(&store.tmp_dir(), &format!("old-{}", digest.hex()), 0o755)?;
        fs::rename(&dest, old.path().join("image"))
            .with_context(|| format!("cannot move the old {} aside", dest.display()))?;
    }
    fs::rename(staging.path(), &dest).with_context(|| {
        format!(
            "cannot move {} to {}",
            staging.path().display(),
            dest.display()
        )
    })?;
    staging.keep();
    sync_dir(&store.images_dir())
}
