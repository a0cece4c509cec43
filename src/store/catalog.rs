//! What is in the store: listing images, finding them by reference or digest,
//! and when each was last used.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::{ImageMeta, Store};
use crate::fsutil::tree_size;
use crate::image::CONVERTER_VERSION;
use crate::reference::ImageRef;
use crate::registry::Digest;

/// File in an image folder whose mtime is the image's last use.
pub(super) const LAST_USED: &str = "last-used";

/// Shortest hex prefix accepted as a digest on the command line.
const MIN_DIGEST_PREFIX: usize = 6;

/// One image folder of the store, with its metadata.
#[derive(Debug, Clone)]
pub struct ImageEntry {
    /// The manifest digest (the folder's name).
    pub digest: Digest,
    /// The image folder, `images/<hex>`.
    pub dir: PathBuf,
    /// `meta.json`.
    pub meta: ImageMeta,
    /// Bytes in the image folder (the squashfs file, mostly).
    pub size: u64,
    /// When it was last pulled or used (its creation when never).
    pub last_used: SystemTime,
}

impl ImageEntry {
    /// Whether the current converter made it (otherwise a pull converts again
    /// and this copy is garbage).
    pub fn is_current(&self) -> bool {
        self.meta.converter_version == CONVERTER_VERSION
    }

    /// The squashfs file.
    pub fn squashfs(&self) -> PathBuf {
        self.dir.join("image.sqfs")
    }

    /// `registry/repository:tag` as pulled (the digest when there was no tag).
    pub fn name(&self) -> String {
        let mut r = self.meta.reference();
        if r.tag.is_some() {
            r.digest = None;
        }
        r.to_string()
    }
}

/// Seconds since the epoch, 0 before it.
pub(super) fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Store {
    /// Every image in the store (of any converter version), most recently
    /// used first. Folders without readable metadata are left out (see
    /// [`Store::broken_image_dirs`]).
    pub fn images(&self) -> Result<Vec<ImageEntry>> {
        let mut images: Vec<ImageEntry> = self
            .image_dirs()?
            .into_iter()
            .filter_map(|(digest, dir)| self.entry(digest, dir))
            .collect();
        images.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.dir.cmp(&b.dir)));
        Ok(images)
    }

    /// Image folders whose metadata is missing or unreadable (nothing can use them).
    pub fn broken_image_dirs(&self) -> Result<Vec<PathBuf>> {
        Ok(self
            .image_dirs()?
            .into_iter()
            .filter(|(digest, dir)| self.entry(digest.clone(), dir.clone()).is_none())
            .map(|(_, dir)| dir)
            .collect())
    }

    /// The images `query` names: a manifest digest (`sha256:<hex>`, or at
    /// least 6 leading hex digits, with or without `sha256:`) or a reference as
    /// pulled (`[REGISTRY#]IMAGE[:TAG]`, docker form too; the tag defaults to
    /// `latest`). Fails when nothing matches or a digest prefix is ambiguous.
    pub fn find_images(&self, query: &str) -> Result<Vec<ImageEntry>> {
        let images = self.images()?;
        let hex = query.strip_prefix("sha256:").unwrap_or(query);
        let looks_like_digest = hex.len() >= MIN_DIGEST_PREFIX
            && hex
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if looks_like_digest {
            let found: Vec<ImageEntry> = images
                .iter()
                .filter(|i| i.digest.hex().starts_with(hex))
                .cloned()
                .collect();
            match found.len() {
                0 => {} // maybe an image named like hex digits
                1 => return Ok(found),
                _ => bail!(
                    "digest prefix '{query}' matches {} images in the store {} ({}): \
                     give more digits",
                    found.len(),
                    self.root().display(),
                    found
                        .iter()
                        .map(|i| i.digest.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        let found: Vec<ImageEntry> = match ImageRef::parse(query) {
            Ok(wanted) => images
                .into_iter()
                .filter(|i| reference_matches(&wanted, &i.meta))
                .collect(),
            Err(_) if looks_like_digest => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        if found.is_empty() {
            bail!(
                "no image '{query}' in the store {}: `berth images --store {}` lists the \
                 stored images",
                self.root().display(),
                self.root().display()
            );
        }
        Ok(found)
    }

    /// `(digest, folder)` of every folder under `images/` named like a digest.
    fn image_dirs(&self) -> Result<Vec<(Digest, PathBuf)>> {
        let dir = self.images_dir();
        let entries =
            fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        let mut dirs = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
            let name = entry.file_name();
            let Some(digest) = name
                .to_str()
                .and_then(|hex| Digest::parse(&format!("sha256:{hex}")).ok())
            else {
                continue;
            };
            dirs.push((digest, entry.path()));
        }
        Ok(dirs)
    }

    fn entry(&self, digest: Digest, dir: PathBuf) -> Option<ImageEntry> {
        let meta: ImageMeta =
            serde_json::from_slice(&fs::read(dir.join("meta.json")).ok()?).ok()?;
        let created = UNIX_EPOCH + Duration::from_secs(meta.created);
        let last_used = fs::metadata(dir.join(LAST_USED))
            .and_then(|m| m.modified())
            .unwrap_or(created);
        Some(ImageEntry {
            size: tree_size(&dir),
            digest,
            dir,
            meta,
            last_used,
        })
    }
}

/// Whether `meta` is the image pulled as `wanted` (user and registry port
/// spelling as given; the digest must match when `wanted` has one).
fn reference_matches(wanted: &ImageRef, meta: &ImageMeta) -> bool {
    if wanted.registry != meta.registry || wanted.repository != meta.repository {
        return false;
    }
    match (&wanted.digest, &wanted.tag) {
        (Some(d), _) => *d == meta.manifest_digest,
        (None, Some(t)) => meta.tag.as_deref() == Some(t.as_str()),
        (None, None) => true,
    }
}
