//! Sealing a stored image before the kernel mounts it.
//!
//! The pull user writes `image.sqfs` and publishes it by rename; root then
//! loop-mounts it with the kernel's squashfs driver, which must never see
//! bytes change under a live mount. So before the first mount root takes the
//! file away from its writer ([`seal`]): on root's own descriptor it makes
//! the file `root:root 0444` (from then on only root could open it for
//! writing), then proves that no writable descriptor or shared writable
//! mapping is left from before: the kernel grants a read lease only while
//! nobody anywhere has the inode open for writing. The lease is released at
//! once; it is the proof, not a lock.
//!
//! The holder, which opens the image again as the pull user, attaches only
//! a file that [`check_sealed`] accepts, and the same file (device and
//! inode, [`SealedFile`]) that root sealed.

use std::fs::{File, Permissions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// The mode of a sealed image file: readable by everyone who can reach it
/// (the store's folders keep users out), writable by nobody.
pub const SEALED_MODE: u32 = 0o444;

/// How often [`seal`] asks for the read lease while a writer is still there.
const LEASE_TRIES: u32 = 10;

/// How long it waits between two tries.
const LEASE_PAUSE: Duration = Duration::from_millis(50);

/// Which file was sealed: its device and inode numbers, so that whoever
/// opens the path again can check it got the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedFile {
    /// `st_dev` of the sealed file.
    pub dev: u64,
    /// `st_ino` of the sealed file.
    pub ino: u64,
}

impl SealedFile {
    /// The identity of the open `file`.
    pub fn of(file: &File) -> io::Result<SealedFile> {
        let meta = file.metadata()?;
        Ok(SealedFile {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

/// Seals the image file `file` (opened read-only by root; `path` names it
/// in messages): a regular file with one link, owned by root or by one of
/// `owners`, becomes `root:root 0444`, and a read lease shows that nobody
/// holds it open for writing. Fails, naming the file and what to do, when
/// a writer is still there after a short wait (the image is left sealed:
/// its writer is the pull user, who must not change it again anyway).
///
/// Needs root (`CAP_CHOWN`, `CAP_FOWNER`, `CAP_LEASE`) with root's own
/// file-system identity.
pub fn seal(file: &File, path: &Path, owners: &[u32]) -> Result<SealedFile> {
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat image file {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!(
            "image file {} is not a regular file; remove the image (berth rmi) and pull it again",
            path.display()
        );
    }
    if meta.nlink() != 1 {
        // A hard link could make root seal (chown, chmod) a file elsewhere.
        bail!(
            "image file {} has {} links instead of one; berth seals and mounts only a file \
             that lives in the store alone: remove the image (berth rmi) and pull it again",
            path.display(),
            meta.nlink()
        );
    }
    if meta.uid() != 0 && !owners.contains(&meta.uid()) {
        bail!(
            "image file {} belongs to uid {}, neither root nor the store's pull user; remove \
             the image (berth rmi) and pull it again",
            path.display(),
            meta.uid()
        );
    }
    if (meta.uid(), meta.gid()) != (0, 0) {
        std::os::unix::fs::fchown(file, Some(0), Some(0)).with_context(|| {
            format!(
                "cannot make image file {} root's before mounting it (a shared store on a file \
                 system that squashes root cannot be mounted with the kernel driver)",
                path.display()
            )
        })?;
    }
    if meta.mode() & 0o7777 != SEALED_MODE {
        file.set_permissions(Permissions::from_mode(SEALED_MODE))
            .with_context(|| format!("cannot make image file {} read-only", path.display()))?;
    }
    prove_no_writer(file, path)?;
    SealedFile::of(file).with_context(|| format!("cannot stat image file {}", path.display()))
}

/// Takes and drops a read lease on `file`: granted only while no one has
/// the inode open for writing.
fn prove_no_writer(file: &File, path: &Path) -> Result<()> {
    let mut tries = 0;
    loop {
        // SAFETY: F_SETLEASE takes an int argument; the descriptor is open.
        let ret = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        if ret == 0 {
            // SAFETY: as above; releasing the lease just taken.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
            return Ok(());
        }
        let err = io::Error::last_os_error();
        tries += 1;
        match err.raw_os_error() {
            Some(libc::EAGAIN) if tries < LEASE_TRIES => std::thread::sleep(LEASE_PAUSE),
            Some(libc::EAGAIN) => bail!(
                "image file {} is still open for writing by some process (the kernel refuses \
                 a read lease: {err}); berth mounts only image bytes that nobody can change. \
                 Find the writer with `fuser -v {}` (a process of the pull user that kept \
                 the file open from before it was published), stop it and start the step \
                 again",
                path.display(),
                path.display()
            ),
            _ => {
                return Err(err).with_context(|| {
                    format!(
                        "cannot check that nobody writes image file {} (fcntl F_SETLEASE; \
                         leases need /proc/sys/fs/leases-enable = 1 and a file system that \
                         supports them)",
                        path.display()
                    )
                })
            }
        }
    }
}

/// Checks that the open image `file` (`path` in messages) is sealed: a
/// regular file with one link, `root:root`, no write or set-id bits, and,
/// when `expected` is given, the very file root sealed.
pub fn check_sealed(file: &File, path: &Path, expected: Option<SealedFile>) -> Result<()> {
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat image file {}", path.display()))?;
    let why = if !meta.file_type().is_file() {
        "it is not a regular file".to_string()
    } else if meta.nlink() != 1 {
        format!("it has {} links", meta.nlink())
    } else if (meta.uid(), meta.gid()) != (0, 0) {
        format!("it belongs to uid {} gid {}", meta.uid(), meta.gid())
    } else if meta.mode() & 0o7222 != 0 {
        format!("its mode is {:o}", meta.mode() & 0o7777)
    } else if expected.is_some_and(|e| (e.dev, e.ino) != (meta.dev(), meta.ino())) {
        "it is not the file that was sealed (the path was replaced)".to_string()
    } else {
        return Ok(());
    };
    bail!(
        "refusing to mount image file {}: it is not sealed ({why}); berth mounts only store \
         images made root's and read-only when the step took them: start the step again",
        path.display()
    )
}

#[cfg(test)]
mod tests;
