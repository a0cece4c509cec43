//! Garbage collection: temp files of dead writers, broken and outdated image
//! folders, unused blobs, then least recently used images down to a size
//! budget. Never an image a running container holds.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Result};

use super::remove::RemoveOutcome;
use super::{ImageEntry, Store};
use crate::fsutil::{sweep_temp, tree_size};
use crate::registry::Digest;
use crate::units::format_size;

/// What `gc` should do beyond removing garbage.
#[derive(Debug, Clone, Default)]
pub struct GcOptions {
    /// Remove least recently used images until the store takes at most this
    /// many bytes.
    pub max_size: Option<u64>,
    /// Only remove what was last used (images), written (blobs) or left
    /// (temp files) longer ago than this. Required for a shared store,
    /// where holds of other nodes are invisible (see `store::shared`).
    pub min_age: Option<Duration>,
}

/// One thing `gc` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// A temp file or folder left by a dead writer.
    Temp(PathBuf),
    /// An image folder without readable metadata.
    Broken(PathBuf),
    /// An image (its name and manifest digest); `outdated` when an older
    /// converter made it.
    Image {
        /// `registry/repository:tag` as pulled.
        name: String,
        /// Manifest digest.
        digest: Digest,
        /// Made by another converter version.
        outdated: bool,
    },
    /// A blob no image uses.
    Blob(Digest),
}

impl fmt::Display for Removed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Removed::Temp(p) => write!(f, "temp {}", p.display()),
            Removed::Broken(p) => write!(f, "broken image folder {}", p.display()),
            Removed::Image {
                name,
                digest,
                outdated,
            } => {
                write!(f, "image {name} ({digest})")?;
                if *outdated {
                    write!(f, ", made by an older berth")?;
                }
                Ok(())
            }
            Removed::Blob(d) => write!(f, "blob {d}"),
        }
    }
}

/// What `gc` did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// What was removed, with the bytes each freed.
    pub removed: Vec<(Removed, u64)>,
    /// Images that would have gone but a running container holds (or a pull
    /// is writing), by name.
    pub in_use: Vec<String>,
    /// Notes for the user (e.g. blobs kept while a pull runs).
    pub notes: Vec<String>,
    /// Bytes in the store before.
    pub size_before: u64,
    /// Bytes in the store after.
    pub size_after: u64,
}

impl GcReport {
    /// Bytes freed in all.
    pub fn freed(&self) -> u64 {
        self.removed.iter().map(|(_, b)| b).sum()
    }
}

impl Store {
    /// Bytes in the store's images, blobs and temp files.
    pub fn disk_usage(&self) -> u64 {
        tree_size(&self.images_dir()) + tree_size(&self.blobs_dir()) + tree_size(&self.tmp_dir())
    }

    /// Collects garbage (see the module doc); with a budget, also removes
    /// least recently used images until the store fits, skipping those in use.
    pub fn gc(&self, options: &GcOptions) -> Result<GcReport> {
        if self.is_shared() && options.min_age.is_none() {
            bail!(
                "the store {} is shared by several nodes (it has the file {}): its images \
                 may be in use on other nodes, which this node cannot see; give --min-age \
                 AGE longer than the longest job (Slurm's MaxTime), e.g. --min-age 8d, to \
                 remove only what no step started within AGE",
                self.root().display(),
                super::shared::MARKER
            );
        }
        let old_enough = |path: &std::path::Path| {
            options
                .min_age
                .is_none_or(|age| super::shared::older_than(path, age))
        };
        let mut report = GcReport {
            size_before: self.disk_usage(),
            ..GcReport::default()
        };
        if options.min_age.is_none() {
            for (path, bytes) in sweep_temp(&self.tmp_dir())? {
                report.removed.push((Removed::Temp(path), bytes));
            }
        } else {
            for (path, bytes) in self.sweep_old_temp(&old_enough)? {
                report.removed.push((Removed::Temp(path), bytes));
            }
        }
        for dir in self.broken_image_dirs()? {
            match self.remove_image_dir(&dir)? {
                Some(bytes) => report.removed.push((Removed::Broken(dir), bytes)),
                None => report.in_use.push(dir.display().to_string()),
            }
        }

        let mut images = self.images()?;
        if let Some(age) = options.min_age {
            let cutoff = SystemTime::now().checked_sub(age);
            images.retain(|i| cutoff.is_some_and(|c| i.last_used <= c));
        }
        images.reverse(); // least recently used first
        let (outdated, mut current): (Vec<_>, Vec<_>) =
            images.into_iter().partition(|i| !i.is_current());
        for image in &outdated {
            self.remove_into(&mut report, image, true)?;
        }
        let sweep = self.remove_unused_blobs_if(None, &old_enough)?;
        report.notes.extend(sweep.skipped);
        for (digest, bytes) in sweep.removed {
            report.removed.push((Removed::Blob(digest), bytes));
        }

        if let Some(budget) = options.max_size {
            let mut usage = self.disk_usage();
            for image in current.drain(..) {
                if usage <= budget {
                    break;
                }
                usage = usage.saturating_sub(self.remove_into(&mut report, &image, false)?);
            }
            if usage > budget {
                report.notes.push(format!(
                    "the store still takes {}, over the budget of {}: the remaining \
                     images are in use",
                    format_size(usage),
                    format_size(budget)
                ));
            }
        }
        report.notes.dedup();
        report.size_after = self.disk_usage();
        Ok(report)
    }

    /// Temp entries (of every host of a shared store) whose writer is gone
    /// and that `old_enough` accepts; for a shared store also `retired/`
    /// images. Returns what was removed, with sizes.
    fn sweep_old_temp(
        &self,
        old_enough: &dyn Fn(&std::path::Path) -> bool,
    ) -> Result<Vec<(PathBuf, u64)>> {
        let mut dirs = vec![self.root().join("tmp")];
        if self.is_shared() {
            dirs = std::fs::read_dir(self.root().join("tmp"))
                .map(|entries| entries.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
        }
        let mut removed = Vec::new();
        for dir in dirs {
            removed.extend(crate::fsutil::sweep_temp_if(&dir, old_enough)?);
        }
        if self.is_shared() {
            removed.extend(crate::fsutil::sweep_temp_if(
                &self.retired_dir(),
                old_enough,
            )?);
        }
        Ok(removed)
    }

    /// Removes one image into `report`; returns the bytes freed.
    fn remove_into(
        &self,
        report: &mut GcReport,
        image: &ImageEntry,
        outdated: bool,
    ) -> Result<u64> {
        match self.remove_image(image)? {
            RemoveOutcome::Removed {
                image_bytes,
                blobs,
                blobs_kept,
            } => {
                let freed = image_bytes + blobs.iter().map(|(_, b)| b).sum::<u64>();
                report.removed.push((
                    Removed::Image {
                        name: image.name(),
                        digest: image.digest.clone(),
                        outdated,
                    },
                    image_bytes,
                ));
                for (digest, bytes) in blobs {
                    report.removed.push((Removed::Blob(digest), bytes));
                }
                report.notes.extend(blobs_kept);
                Ok(freed)
            }
            RemoveOutcome::InUse | RemoveOutcome::Pulling => {
                report
                    .in_use
                    .push(format!("{} ({})", image.name(), image.digest));
                Ok(0)
            }
        }
    }
}
