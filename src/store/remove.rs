//! Removing images and the blobs no image needs any more.
//!
//! An image folder is removed only under an exclusive lock on its squashfs
//! file (no container holds it, see [`super::hold`]) and its pull lock (no
//! pull of it is running). Blobs are removed only under the exclusive store
//! lock, which every pull that downloads holds shared, so a blob a running
//! pull has just found in the store cannot vanish under it.

use std::collections::HashSet;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, Result};

use super::catalog::ImageEntry;
use super::hold::{lock_unused, Exclusive};
use super::Store;
use crate::fsutil::{sync_dir, tree_size, FileLock, TempEntry};
use crate::registry::Digest;

/// What [`Store::remove_image`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoveOutcome {
    /// The image folder is gone.
    Removed {
        /// Bytes of the image folder.
        image_bytes: u64,
        /// Blobs removed with it (no other image used them).
        blobs: Vec<(Digest, u64)>,
        /// Why blobs were kept, when they were (a pull was running).
        blobs_kept: Option<String>,
    },
    /// A running container holds the image; nothing was removed.
    InUse,
    /// The image is being pulled right now; nothing was removed.
    Pulling,
}

/// What [`Store::remove_unused_blobs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlobSweep {
    /// Blobs removed, with their sizes.
    pub removed: Vec<(Digest, u64)>,
    /// Why nothing was removed, when a pull held the store lock.
    pub skipped: Option<String>,
}

impl Store {
    /// The lock pulls hold shared while they download and convert, and blob
    /// removal takes exclusively.
    pub(super) fn store_lock_path(&self) -> PathBuf {
        self.locks_dir().join("store.lock")
    }

    /// Removes `image`'s folder, then the blobs of its layers that no other
    /// image uses, unless a container holds it or it is being pulled.
    pub fn remove_image(&self, image: &ImageEntry) -> Result<RemoveOutcome> {
        let pull_lock = self
            .locks_dir()
            .join(format!("{}.lock", image.digest.hex()));
        let Some(_pulling) = FileLock::try_exclusive(&pull_lock)? else {
            return Ok(RemoveOutcome::Pulling);
        };
        let Some(image_bytes) = self.remove_image_dir(&image.dir)? else {
            return Ok(RemoveOutcome::InUse);
        };
        let layers: Vec<Digest> = image
            .meta
            .layers
            .iter()
            .filter_map(|d| Digest::parse(d).ok())
            .collect();
        let sweep = self.remove_unused_blobs(Some(&layers))?;
        Ok(RemoveOutcome::Removed {
            image_bytes,
            blobs: sweep.removed,
            blobs_kept: sweep.skipped,
        })
    }

    /// Removes an image folder unless a container holds its squashfs file;
    /// returns the bytes freed, `None` when it is in use.
    pub(super) fn remove_image_dir(&self, dir: &std::path::Path) -> Result<Option<u64>> {
        let _exclusive = match lock_unused(self, &dir.join("image.sqfs"))? {
            Exclusive::Busy => return Ok(None),
            Exclusive::Locked(file) => Some(file),
            Exclusive::Missing => None,
        };
        let bytes = tree_size(dir);
        let name = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        // Rename first: the image disappears at once, whatever the removal takes.
        let trash = TempEntry::dir(&self.staging_dir()?, &format!("rmi-{name}"), 0o700)?;
        fs::rename(dir, trash.path().join("image")).with_context(|| {
            format!(
                "cannot remove {}: check that you may write to the store {}",
                dir.display(),
                self.root().display()
            )
        })?;
        sync_dir(&self.images_dir())?;
        drop(trash);
        Ok(Some(bytes))
    }

    /// Removes blobs no stored image lists among its layers: all such blobs
    /// when `candidates` is `None`, else only those among `candidates`. Does
    /// nothing (and says why) while a pull is running.
    pub fn remove_unused_blobs(&self, candidates: Option<&[Digest]>) -> Result<BlobSweep> {
        self.remove_unused_blobs_if(candidates, &|_| true)
    }

    /// Like [`Store::remove_unused_blobs`], only for blob files `wanted`
    /// accepts (`gc --min-age`: old enough).
    pub(super) fn remove_unused_blobs_if(
        &self,
        candidates: Option<&[Digest]>,
        wanted: &dyn Fn(&std::path::Path) -> bool,
    ) -> Result<BlobSweep> {
        let Some(_lock) = FileLock::try_exclusive(&self.store_lock_path())? else {
            return Ok(BlobSweep {
                removed: Vec::new(),
                skipped: Some(
                    "a pull is running; unused blobs are kept (run `berth gc` later)".to_string(),
                ),
            });
        };
        let used: HashSet<String> = self
            .images()?
            .into_iter()
            .flat_map(|i| i.meta.layers)
            .collect();
        let candidates: Vec<Digest> = match candidates {
            Some(c) => c.to_vec(),
            None => self.blob_digests()?,
        };
        let mut removed = Vec::new();
        for digest in candidates {
            if used.contains(digest.as_str()) {
                continue;
            }
            let path = self.blob_path(&digest);
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue; // already gone
            };
            if !wanted(&path) {
                continue;
            }
            fs::remove_file(&path).with_context(|| {
                format!(
                    "cannot remove blob {}: check that you may write to the store {}",
                    path.display(),
                    self.root().display()
                )
            })?;
            removed.push((digest, meta.len()));
        }
        Ok(BlobSweep {
            removed,
            skipped: None,
        })
    }

    /// Digests of the blobs under `blobs/sha256/`.
    fn blob_digests(&self) -> Result<Vec<Digest>> {
        let dir = self.blobs_dir();
        let entries =
            fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        Ok(entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                Digest::parse(&format!("sha256:{}", name.to_str()?)).ok()
            })
            .collect())
    }
}
