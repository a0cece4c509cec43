//! A stored image asked for under a repository it was never downloaded from.
//!
//! The store hands an image out when one of its recorded origins lets the
//! user read it ([`super::origin`]). When the user names another repository
//! (a second registry holding the same digest, a mirror's own name, a
//! registry that moved) and those origins refuse or cannot be reached, the
//! named repository may still hold the image. It proves that the way a pull
//! from it would: it serves the manifest by digest and every blob the
//! manifest lists (config and layers), each hashing to its digest, to this
//! user. Bytes are hashed and dropped: the store already holds them. A
//! registry that answers 200 to everything proves nothing, since it cannot
//! make up bytes that hash right. Once proven, the repository is recorded as
//! one more origin, so the next start needs no such download.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

use super::progress::Progress;
use super::{ImageMeta, ImageOrigin, Store};
use crate::fsutil::{write_synced, FileLock};
use crate::reference::ImageRef;
use crate::registry::{Digest, Platform, RegistryClient};

/// Downloads (and drops) every blob of `digest` from `image`'s repository,
/// then records that repository as one more origin of the stored image.
pub(super) fn prove_and_record(
    store: &Store,
    client: &RegistryClient,
    image: &ImageRef,
    digest: &Digest,
    progress: &Progress,
) -> Result<()> {
    let pinned = image.with_digest(digest.as_str());
    progress.say(format!(
        "{digest} is in the store from another repository: checking that {} serves all of it",
        pinned
    ));
    let resolved = client.resolve(&pinned, &Platform::current())?;
    if resolved.manifest_digest != *digest {
        anyhow::bail!(
            "{pinned} names the image index of another platform's manifest, not the stored \
             {digest}"
        );
    }
    let manifest = &resolved.manifest;
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        let blob_digest = Digest::parse(&blob.digest).map_err(|e| {
            anyhow::anyhow!("the manifest of {pinned} lists a blob with a bad digest: {e}")
        })?;
        client.fetch_blob(&pinned, &blob_digest, Some(blob.size), &mut std::io::sink())?;
    }
    let origin = ImageOrigin {
        registry: image.registry.clone(),
        repository: image.repository.clone(),
        anonymous: !client.used_credentials(),
    };
    if store.is_shared() {
        // meta.json is never replaced under another node's reader (ESTALE on
        // NFS): on a shared store each such start repeats the proof.
        return Ok(());
    }
    record_origin(store, digest, origin)
}

/// Adds `origin` to the stored image's `meta.json` (replaced whole, under the
/// image's pull lock, so two nodes' or steps' records do not lose each other).
fn record_origin(store: &Store, digest: &Digest, origin: ImageOrigin) -> Result<()> {
    let lock_path = store.locks_dir().join(format!("{}.lock", digest.hex()));
    let _lock = FileLock::exclusive(&lock_path, || {})?;
    let dir = store.image_dir(digest);
    let mut meta: ImageMeta = store
        .read_meta(digest)
        .with_context(|| format!("the stored image {digest} has no readable meta.json"))?;
    let mut origins = meta.origins();
    if origins.contains(&origin) {
        return Ok(());
    }
    origins.push(origin);
    meta.origins = origins;
    replace_meta(&dir, &meta)
}

/// Writes `meta` to `dir/meta.json` through a temp file and a rename.
fn replace_meta(dir: &Path, meta: &ImageMeta) -> Result<()> {
    let tmp = dir.join(format!(".meta.json.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let written = write_synced(&tmp, &serde_json::to_vec_pretty(meta)?).and_then(|()| {
        fs::rename(&tmp, dir.join("meta.json"))
            .with_context(|| format!("cannot replace {}", dir.join("meta.json").display()))
    });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written?;
    crate::fsutil::sync_dir(dir)
}
