//! One pull: resolve, check the store, lock, download blobs in parallel,
//! convert, publish.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use super::board::Board;
use super::catalog::LAST_USED;
use super::progress::{mb, LayerProgress, Progress};
use super::{lease, origin, proof, shared, ImageMeta, Store, StoredImage};
use crate::fsutil::{sync_dir, write_synced, FileLock, TempEntry};
use crate::image::writeback::start_writeback;
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

/// Pulls `image` into `store`. A full file system is named as such, with what
/// to do; what the pull wrote is gone again by then (temp entries).
pub(super) fn pull(store: &Store, image: &ImageRef, options: &PullOptions) -> Result<StoredImage> {
    pull_unchecked(store, image, options).map_err(|e| {
        if !out_of_space(&e) {
            return e;
        }
        e.context(format!(
            "no space left in the image store {} while pulling {image}: free space there \
             (`berth gc --max-size SIZE`, `berth rmi IMAGE`) or move the store to a larger \
             file system (store_path)",
            store.root().display()
        ))
    })
}

/// Whether `e` comes from a full file system or an exhausted quota (also as
/// reported by tar2sqfs, which says so only in its message).
fn out_of_space(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let io = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error);
        matches!(io, Some(libc::ENOSPC | libc::EDQUOT))
            || cause.to_string().contains("No space left on device")
            || cause.to_string().contains("Disk quota exceeded")
    })
}

fn pull_unchecked(store: &Store, image: &ImageRef, options: &PullOptions) -> Result<StoredImage> {
    let started = std::time::Instant::now();
    let progress = Progress::new(options.progress);
    let client = RegistryClient::new(&options.registry);
    // For `srun -v`'s per-node timings (step::timings reads this line).
    let looked_up = || {
        progress.say(format!(
            "looked up {image} in {} ms",
            started.elapsed().as_millis()
        ))
    };
    let private = |e: anyhow::Error| refused_but_cached(store, image, e);
    if let Some(found) = pinned_in_store(store, &client, image, &progress).map_err(private)? {
        looked_up();
        return Ok(found);
    }
    progress.say(format!("resolving {image}"));
    let resolved = client
        .resolve(image, &Platform::current())
        .map_err(private)?;
    let digest = resolved.manifest_digest.clone();
    looked_up();
    if let Some(found) = store.load(&digest)? {
        check_resolved_access(store, &client, image, &digest, &progress).map_err(private)?;
        progress.say(format!("{image} ({digest}) is already in the store"));
        store.touch_last_used(&digest);
        return Ok(with_reference(found, &resolved));
    }
    if options.cached_only {
        return Err(super::NotInStore {
            image: image.to_string(),
            manifest_digest: digest.to_string(),
        }
        .into());
    }

    let _guard = match store.shared {
        // One node of all pulls it; the others wait for it to publish.
        Some(settings) => {
            let published = || Ok(store.load(&digest)?.is_some());
            match shared::lease_image(store, &digest, settings, &progress, published)? {
                Some(lease) => PullGuard::Lease(lease),
                None => PullGuard::None,
            }
        }
        None => {
            let lock_path = store.locks_dir().join(format!("{}.lock", digest.hex()));
            PullGuard::Lock(FileLock::exclusive(&lock_path, || {
                progress.say(format!("waiting for another pull of {digest}"))
            })?)
        }
    };
    if let Some(found) = store.load(&digest)? {
        check_resolved_access(store, &client, image, &digest, &progress).map_err(private)?;
        progress.say(format!("{image} ({digest}) was pulled meanwhile"));
        store.touch_last_used(&digest);
        return Ok(with_reference(found, &resolved));
    }
    // Blobs found in the store below must stay until the conversion is done
    // (a shared store's gc keeps recent blobs instead: see store::shared).
    let _downloading = match store.shared {
        Some(_) => None,
        None => Some(FileLock::shared(&store.store_lock_path())?),
    };

    let (layers, notes) = usable_layers(image, &resolved)?;
    for note in notes {
        eprintln!("berth: {note}");
    }
    let config_desc = &resolved.manifest.config;
    let config_digest = parse_digest(image, &config_desc.digest)?;
    let config_bytes = client
        .fetch_blob_bytes(image, &config_digest, config_desc.size)
        .with_context(|| format!("cannot fetch the configuration of {image}"))?;
    let config = ImageConfig::from_oci_json(&config_bytes).with_context(|| {
        format!("the image configuration {config_digest} of {image} is not valid JSON")
    })?;

    let total: u64 = layers.iter().map(|l| l.size).sum();
    progress.say(format!(
        "fetching and converting {} ({})",
        count(layers.len(), "layer"),
        mb(total)
    ));
    let sizes: Vec<(String, u64)> = layers.iter().map(|l| (l.digest.clone(), l.size)).collect();
    let bars = Arc::new(Progress::with_layers(options.progress, &sizes));
    let staging = TempEntry::dir(&store.tmp_dir(), &format!("image-{}", digest.hex()), 0o755)?;
    let sqfs = staging.path().join("image.sqfs");
    let stats = bars.run_ticker(|| {
        download_and_convert(store, &client, image, &layers, options, &bars, &sqfs)
    })?;
    for w in &stats.warnings {
        eprintln!("berth: warning: {image}: {w}");
    }
    progress.say(format!(
        "pulled {} ({}) into a {} squashfs ({} files) in {:.1} s",
        count(layers.len(), "layer"),
        mb(total),
        mb(stats.image_size),
        stats.paths,
        started.elapsed().as_secs_f64()
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
        anonymous: !client.used_credentials(),
        origins: vec![super::ImageOrigin {
            registry: image.registry.clone(),
            repository: image.repository.clone(),
            anonymous: !client.used_credentials(),
        }],
        user_file: false,
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

/// "1 layer", "3 layers".
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// What keeps other pulls of the same image waiting while this one works.
enum PullGuard {
    /// A node-local store's per-image `flock`.
    Lock(#[allow(dead_code)] FileLock),
    /// A shared store's lease.
    Lease(#[allow(dead_code)] lease::Lease),
    /// Another node published the image while this one waited.
    None,
}

/// A registry refusal of `image` that is in the store says so: the image is
/// cached on this node, but handed only to users the registry lets read it.
fn refused_but_cached(store: &Store, image: &ImageRef, e: anyhow::Error) -> anyhow::Error {
    let Some(RegistryError::Denied {
        registry,
        status,
        credentials,
        ..
    }) = e.downcast_ref::<RegistryError>()
    else {
        return e;
    };
    if !store.has_cached(image) {
        return e;
    }
    anyhow::anyhow!(
        "the registry {registry} refused your credentials for {image} (HTTP {status}); it is \
         cached on this node but private, and berth hands a private image only to users the \
         registry lets read it: add credentials for {registry} to {credentials}"
    )
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

/// Media types of non-distributable ("foreign") layers: the registry may not
/// hold them; the manifest's `urls` say where they live.
const FOREIGN_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// Checks media types; returns the layers to fetch. A non-distributable layer
/// with `urls` is skipped with a note, as the image spec allows (it is not
/// for redistribution, e.g. a Windows base layer); without `urls` it is
/// fetched from the registry like any other layer.
fn usable_layers(
    image: &ImageRef,
    resolved: &ResolvedImage,
) -> Result<(Vec<Descriptor>, Vec<String>)> {
    let config_type = resolved.manifest.config.media_type.as_str();
    if !config_type.is_empty() && !CONFIG_TYPES.contains(&config_type) {
        return Err(RegistryError::UnsupportedManifest {
            image: image.to_string(),
            media_type: config_type.to_string(),
            hint: "this is not a container image (an OCI artifact?)".to_string(),
        }
        .into());
    }
    let mut usable = Vec::new();
    let mut notes = Vec::new();
    for layer in &resolved.manifest.layers {
        let t = layer.media_type.as_str();
        if FOREIGN_TYPES.contains(&t) {
            if layer.urls.is_empty() {
                usable.push(layer.clone());
            } else {
                notes.push(format!(
                    "note: {image}: skipped non-distributable layer {} ({t}, from {}): \
                     the image spec lets it stay out of the image",
                    layer.digest,
                    layer.urls.join(", ")
                ));
            }
            continue;
        }
        if !t.is_empty() && !LAYER_TYPES.contains(&t) {
            return Err(RegistryError::UnsupportedManifest {
                image: image.to_string(),
                media_type: t.to_string(),
                hint: format!(
                    "layer {} has a media type berth cannot unpack",
                    layer.digest
                ),
            }
            .into());
        }
        usable.push(layer.clone());
    }
    Ok((usable, notes))
}

/// A digest-pinned image already in the store, handed out with no download:
/// with no network at all when it was fetched anonymously from the same
/// repository, else after one of the repositories it came from served its
/// manifest to the caller (a cached private image is only for those who
/// may read it, [`origin::check_access`]).
fn pinned_in_store(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    progress: &Progress,
) -> Result<Option<StoredImage>> {
    let Some(found) = store.find_pinned_image(image)? else {
        return Ok(None);
    };
    if !origin::public_here(&found.meta, image) {
        // Asked of the image's own origins, never only of the name the
        // requester gave: denied or unknown, the error says so and nothing
        // from the store is handed out.
        access_through_origins_or_proof(
            store,
            client,
            &found.meta,
            image,
            &found.digest,
            progress,
        )?;
    }
    progress.say(format!("{image} is already in the store"));
    Ok(Some(found.hand_out(store, image)))
}

/// A stored image that a digest-pinned reference names (not yet checked
/// against who asks).
pub(super) struct PinnedImage {
    /// Its manifest digest.
    pub digest: Digest,
    /// Its `meta.json` (origins).
    pub meta: ImageMeta,
    /// The image as stored.
    pub stored: StoredImage,
}

impl PinnedImage {
    /// The image for `image`'s requester, its use recorded for `berth gc`.
    pub fn hand_out(mut self, store: &Store, image: &ImageRef) -> StoredImage {
        store.touch_last_used(&self.digest);
        self.stored.reference = Some(ImageRef {
            user: None,
            ..image.with_digest(self.digest.as_str())
        });
        self.stored
    }
}

impl Store {
    /// The stored image `image` pins by digest (its manifest digest, or the
    /// index digest for this platform), when the store has it from a
    /// registry (a user's re-packed file is never named by a reference).
    pub(super) fn find_pinned_image(&self, image: &ImageRef) -> Result<Option<PinnedImage>> {
        let Some(Ok(pinned)) = image.digest.as_deref().map(Digest::parse) else {
            return Ok(None);
        };
        let Some((digest, meta)) = self.find_pinned(&pinned)? else {
            return Ok(None);
        };
        if meta.user_file {
            return Ok(None);
        }
        Ok(self.load(&digest)?.map(|stored| PinnedImage {
            digest,
            meta,
            stored,
        }))
    }

    /// The stored image `image` pins by digest, when it may be handed out
    /// with no registry request: it was downloaded anonymously from that
    /// very repository ([`origin::public_here`]), or `granted` says that
    /// this requester's access to its manifest digest was checked already
    /// (for this job, on this node). What slurmstepd hands out itself, with
    /// no pull helper; `None` sends the caller to a pull (which asks the
    /// image's origins for a private one).
    pub fn find_pinned_without_registry(
        &self,
        image: &ImageRef,
        granted: impl FnOnce(&Digest) -> bool,
    ) -> Result<Option<StoredImage>> {
        let Some(found) = self.find_pinned_image(image)? else {
            return Ok(None);
        };
        if !origin::public_here(&found.meta, image) && !granted(&found.digest) {
            return Ok(None);
        }
        Ok(Some(found.hand_out(self, image)))
    }
}

/// After `image` resolved (with the caller's credentials) to `digest`, which
/// is in the store: when the store's copy came from another repository,
/// one of its own origins must let the caller read it too (any server can
/// serve the bytes of a manifest it knows; the layers are another matter).
fn check_resolved_access(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    digest: &Digest,
    progress: &Progress,
) -> Result<()> {
    let meta = store.read_meta(digest).with_context(|| {
        format!(
            "the stored image {digest} has no readable meta.json: remove it (berth rmi) and \
             pull again"
        )
    })?;
    if meta.user_file {
        anyhow::bail!(
            "the stored image {digest} is a user's re-packed squashfs file, not the image {image}"
        );
    }
    if meta.came_from(image) {
        return Ok(());
    }
    access_through_origins_or_proof(store, client, &meta, image, digest, progress)
}

/// One of the stored image's origins lets the caller read it; or, when
/// `image` names a repository it did not come from, that repository serves
/// every blob of it ([`proof`]). When both fail, the error is the origins'
/// (it names the image's own registry), with the proof's failure beside it.
fn access_through_origins_or_proof(
    store: &Store,
    client: &RegistryClient,
    meta: &ImageMeta,
    image: &ImageRef,
    digest: &Digest,
    progress: &Progress,
) -> Result<()> {
    let refused = match origin::check_access(client, meta, image, digest) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if meta.came_from(image) {
        return Err(refused);
    }
    proof::prove_and_record(store, client, image, digest, progress).map_err(|not_proven| {
        refused.context(format!(
            "{digest} is in this node's store, but neither its own registry nor {} lets you \
             read it ({}: {not_proven:#}); the store's copy is handed only to users one of them \
             serves",
            image.registry, image.registry
        ))
    })
}

/// Downloads the layers not yet in the store (top layer first, up to
/// [`PARALLEL_DOWNLOADS`] at a time) while converting them into `sqfs`: the
/// conversion reads the top layer as soon as it is verified, while lower ones
/// still download.
fn download_and_convert(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    layers: &[Descriptor],
    options: &PullOptions,
    progress: &Progress,
    sqfs: &std::path::Path,
) -> Result<image::ConvertStats> {
    let retry = options.registry.retry;
    let digests = layers
        .iter()
        .map(|l| parse_digest(image, &l.digest))
        .collect::<Result<Vec<_>>>()?;
    let board = Arc::new(Board::new(layers.len()));
    // Top layer first: the conversion starts there.
    let next = Mutex::new(layers.len());
    let stop = AtomicBool::new(false);
    let layer_list: Vec<Layer> = digests
        .iter()
        .enumerate()
        .map(|(i, digest)| {
            let board = Arc::clone(&board);
            Layer::from_opener(digest.to_string(), move || board.open(i))
        })
        .collect();
    let squashfs = SquashfsOptions {
        max_bytes: options.max_image_bytes,
        compressor_options: Some(format!("level={}", options.zstd_level)),
        ..SquashfsOptions::default()
    };
    let convert = || image::convert_with(&layer_list, sqfs, &squashfs, |i| progress.converting(i));
    let converted = std::thread::scope(|s| {
        for _ in 0..PARALLEL_DOWNLOADS.min(layers.len()) {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let i = {
                    let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                    if *n == 0 {
                        return;
                    }
                    *n -= 1;
                    *n
                };
                let blob = Blob {
                    digest: &digests[i],
                    size: layers[i].size,
                    index: i,
                };
                match fetch_blob(store, client, image, blob, retry, progress, &board) {
                    Ok(path) => board.stored(i, path),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        board.fail(i, e);
                    }
                }
            });
        }
        let mut converted = convert();
        if converted.is_err() && board.restarted() {
            // A download started over under the streaming conversion: convert
            // again from the stored blobs once they are all there.
            board.stop_streaming();
            board.wait_all();
            // A failed download keeps its error for the report below.
            if !board.failed() {
                eprintln!("berth: {image}: converting again after a layer download restarted");
                converted = convert();
            }
        }
        if converted.is_err() {
            stop.store(true, Ordering::Relaxed);
            board.abort();
        }
        converted
    });
    // A download error explains a conversion that could not open its layer.
    if let Some(e) = board.take_error() {
        return Err(e);
    }
    converted.with_context(|| format!("cannot convert {image} to squashfs"))
}

/// One layer blob to fetch: its digest, size and index in the manifest.
#[derive(Clone, Copy)]
struct Blob<'a> {
    digest: &'a Digest,
    size: u64,
    index: usize,
}

/// Fetches one blob into `blobs/` via a locked temp file, verified. A
/// connection lost in the middle of the body starts the blob again, as often
/// as `retry` allows (the request itself is retried by the client).
fn fetch_blob(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    blob: Blob<'_>,
    retry: RetryPolicy,
    progress: &Progress,
    board: &Board,
) -> Result<PathBuf> {
    let Blob {
        digest,
        size,
        index,
    } = blob;
    let dest = store.blob_path(digest);
    if fs::metadata(&dest).is_ok_and(|m| m.len() == size) {
        progress.stored(index);
        return Ok(dest);
    }
    // A pull of another image that shares this layer may be downloading it:
    // wait for it and use its blob, so each blob is fetched once per store.
    let blob_lock = store
        .locks_dir()
        .join(format!("blob-{}.lock", digest.hex()));
    let _blob_lock = FileLock::exclusive(&blob_lock, || {})?;
    if fs::metadata(&dest).is_ok_and(|m| m.len() == size) {
        progress.stored(index);
        return Ok(dest);
    }
    progress.downloading(index);
    let mut attempt = 1;
    loop {
        progress.layer(index).restart();
        let target = BlobTarget {
            board,
            index,
            counter: progress.layer(index),
        };
        match download_blob(store, client, image, digest, size, target) {
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
    progress.fetched(index);
    Ok(dest)
}

/// Whether `e` is a registry connection that broke (worth another try).
fn connection_lost(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<RegistryError>(),
        Some(RegistryError::Unreachable { .. })
    )
}

/// Where one try of [`fetch_blob`] reports: the board (for the conversion
/// following the download) and the layer's progress counter.
struct BlobTarget<'a> {
    board: &'a Board,
    index: usize,
    counter: &'a LayerProgress,
}

/// One try of [`fetch_blob`]: download into a temp file that the conversion
/// may already read (see [`Board`]), then sync and rename.
fn download_blob(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    digest: &Digest,
    size: u64,
    target: BlobTarget<'_>,
) -> Result<()> {
    let dest = store.blob_path(digest);
    let (tmp, file) = TempEntry::file(&store.tmp_dir(), &format!("blob-{}", digest.hex()))?;
    let file = Arc::new(file);
    target.board.begin(target.index, Arc::clone(&file));
    let mut writer = BufWriter::with_capacity(
        1 << 20,
        GrowingFile {
            file: &file,
            written: 0,
            started_writeback: 0,
            board: target.board,
            index: target.index,
        },
    );
    client.fetch_blob(
        image,
        digest,
        Some(size),
        &mut Counted {
            inner: &mut writer,
            counter: target.counter,
        },
    )?;
    writer
        .flush()
        .with_context(|| format!("cannot write {}", tmp.path().display()))?;
    drop(writer);
    target.board.complete(target.index);
    file.sync_all()
        .with_context(|| format!("cannot sync {}", tmp.path().display()))?;
    if store.is_shared() {
        // Never over a blob another node may be reading (ESTALE on NFS);
        // the temp file goes with `tmp`.
        return shared::link_no_replace(tmp.path(), &dest);
    }
    fs::rename(tmp.path(), &dest)
        .with_context(|| format!("cannot move {} to {}", tmp.path().display(), dest.display()))?;
    tmp.keep();
    Ok(())
}

/// Bytes written to a layer's temp file between two writeback starts.
const WRITEBACK_CHUNK: u64 = 32 << 20;

/// A blob's temp file: tells the board how far it has grown, and starts the
/// disk writeback as it goes so that the final fsync finds little to do.
struct GrowingFile<'a> {
    file: &'a File,
    written: u64,
    started_writeback: u64,
    board: &'a Board,
    index: usize,
}

impl std::io::Write for GrowingFile<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = (&mut &*self.file).write(buf)?;
        self.written += n as u64;
        self.board.grew(self.index, self.written);
        if self.written - self.started_writeback >= WRITEBACK_CHUNK {
            start_writeback(self.file, self.started_writeback, self.written);
            self.started_writeback = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that reports the bytes passing through to a layer's progress.
struct Counted<'a, W> {
    inner: &'a mut W,
    counter: &'a LayerProgress,
}

impl<W: std::io::Write> std::io::Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.counter.add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Renames the staged image directory into `images/`, replacing an image made
/// by another converter version.
pub(super) fn publish(store: &Store, staging: TempEntry, digest: &Digest) -> Result<()> {
    let dest = store.image_dir(digest);
    if store.is_shared() {
        let current = store.load(digest).ok().flatten().is_some();
        if shared::publish_no_replace(store, staging.path(), &dest, current)? {
            staging.keep();
        }
        return sync_dir(&store.images_dir());
    }
    if dest.exists() {
        // An older conversion (the lock is held, and load() refused it): move it
        // aside atomically, then remove it. Mounted copies stay valid.
        let old = TempEntry::dir(
            &store.staging_dir()?,
            &format!("old-{}", digest.hex()),
            0o755,
        )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(layers: &str) -> ResolvedImage {
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:{c}","size":2}},"layers":{layers}}}"#,
            c = "c".repeat(64)
        );
        let manifest: crate::registry::ImageManifest = serde_json::from_str(&manifest).unwrap();
        let image = ImageRef::parse("registry.example:5000/win/app:1").unwrap();
        ResolvedImage {
            image,
            manifest_digest: Digest::of_bytes(b"m"),
            manifest_bytes: Vec::new(),
            manifest,
            index_digest: None,
            platform: None,
        }
    }

    #[test]
    fn foreign_layers_with_urls_are_skipped_with_a_note() {
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "d".repeat(64));
        let layers = format!(
            r#"[{{"mediaType":"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip","digest":"sha256:{a}","size":5,"urls":["https://cdn.example/base"]}},
                {{"mediaType":"application/vnd.oci.image.layer.nondistributable.v1.tar+gzip","digest":"sha256:{b}","size":6}},
                {{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:{c}","size":7}}]"#
        );
        let r = resolved(&layers);
        let (usable, notes) = usable_layers(&r.image, &r).unwrap();
        // With urls: skipped, with a note naming it; without: fetched like any layer.
        let kept: Vec<_> = usable.iter().map(|l| l.size).collect();
        assert_eq!(kept, [6, 7]);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains(&a) && notes[0].contains("cdn.example"),
            "{notes:?}"
        );
    }

    #[test]
    fn a_full_file_system_is_recognised() {
        let full = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOSPC))
            .context("cannot write blob");
        assert!(out_of_space(&full));
        let tool = anyhow::anyhow!("tar2sqfs: writing image.sqfs: No space left on device");
        assert!(out_of_space(&tool.context("cannot convert")));
        let other = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EIO));
        assert!(!out_of_space(&other));
    }

    #[test]
    fn unknown_layer_types_are_refused() {
        let layers = format!(
            r#"[{{"mediaType":"application/vnd.example.weights","digest":"sha256:{}","size":5}}]"#,
            "a".repeat(64)
        );
        let r = resolved(&layers);
        let e = usable_layers(&r.image, &r).unwrap_err();
        assert!(
            format!("{e:#}").contains("application/vnd.example.weights"),
            "{e:#}"
        );
    }
}
