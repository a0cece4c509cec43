//! Holding a stored image while a container uses it.
//!
//! A running container keeps a shared `flock` on its image's `image.sqfs`
//! ([`ImageHold`]); `berth rmi` and `berth gc` try an exclusive lock first and
//! leave the image alone when they cannot get it. `flock` locks die with the
//! process, so a crashed container never pins an image.
//!
//! Root's hold of a store image also seals it ([`crate::seal`]): from then
//! on its bytes are root's and read-only, and no writer from before is left.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{Store, StoredImage};
use crate::fsutil::{lock_shared, try_lock_exclusive};
use crate::seal::{seal, SealedFile};

/// A shared lock on a stored image's squashfs file: while it lives, `rmi` and
/// `gc` do not remove the image. Dropping it releases the lock.
#[derive(Debug)]
pub struct ImageHold {
    file: File,
    path: PathBuf,
    sealed: Option<SealedFile>,
}

impl ImageHold {
    /// The squashfs file held.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open squashfs file (a container may mount through it).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Takes `file` as the held file: this process's copy of the one
    /// another process opened (a clone of slurmstepd under
    /// `contain_spank`). The number held before is that process's: it is
    /// forgotten, never closed.
    pub fn adopt_file(&mut self, file: std::os::fd::OwnedFd) {
        std::mem::forget(std::mem::replace(&mut self.file, File::from(file)));
    }

    /// The sealed file, when root took the hold on a store image: the
    /// holder mounts only this file (see [`crate::seal::check_sealed`]).
    pub fn sealed(&self) -> Option<SealedFile> {
        self.sealed
    }
}

impl Store {
    /// Marks `image` as in use until the returned hold is dropped. Fails when
    /// the image was removed from the store meanwhile (pull it again).
    ///
    /// Works for squashfs files given by path too (the lock is then on that file).
    ///
    /// As root, an image inside the store is sealed first ([`seal`]): made
    /// `root:root 0444` and proven free of writers; fails when a writer is
    /// left (the message names the file and what to do).
    pub fn hold(&self, image: &StoredImage) -> Result<ImageHold> {
        let path = image.squashfs.clone();
        let removed = || {
            format!(
                "image {} was removed from the store {} while it was starting: pull it again",
                image_name(image),
                self.root().display()
            )
        };
        let file = match self.open_squashfs_at(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(removed()),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open {}", path.display()));
            }
        };
        match lock_shared(&file) {
            Ok(()) => {}
            // A shared file system without flock (Lustre mounted without
            // `flock`/`localflock`): the container runs unheld; a shared
            // store's gc goes by age anyway (see store::shared).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS) | Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP)
                ) => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        // rmi renames the folder away under an exclusive lock: what we locked
        // must still be the file at `path`.
        let held = file
            .metadata()
            .with_context(|| format!("cannot stat {}", path.display()))?;
        match std::fs::metadata(&path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {}
            _ => bail!(removed()),
        }
        let in_store = path.starts_with(self.root()) && image.manifest_digest.is_some();
        let sealed = if in_store && nix::unistd::geteuid().is_root() {
            Some(seal(&file, &path, &self.file_owners())?)
        } else {
            None
        };
        Ok(ImageHold { file, path, sealed })
    }
}

/// The outcome of [`lock_unused`].
#[derive(Debug)]
pub(super) enum Exclusive {
    /// Nobody holds the file; it stays locked until this is dropped, so no
    /// container can take a hold while the image is removed.
    Locked(File),
    /// There is no such file.
    Missing,
    /// A container holds it.
    Busy,
}

/// Tries to lock the squashfs file at `path` (in `store`) exclusively,
/// without waiting; opened as [`Store::hold`] opens it.
pub(super) fn lock_unused(store: &Store, path: &Path) -> Result<Exclusive> {
    let file = match store.open_squashfs_at(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Exclusive::Missing),
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
    };
    if try_lock_exclusive(&file).with_context(|| format!("cannot lock {}", path.display()))? {
        Ok(Exclusive::Locked(file))
    } else {
        Ok(Exclusive::Busy)
    }
}

fn image_name(image: &StoredImage) -> String {
    match (&image.reference, &image.manifest_digest) {
        (Some(r), _) => r.to_string(),
        (None, Some(d)) => d.clone(),
        (None, None) => image.squashfs.display().to_string(),
    }
}
