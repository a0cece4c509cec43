//! Removing a job's fan-out folder in the job epilog, as root, although its
//! user owns it and may have left anything there.
//!
//! A required plugin whose epilog fails (or hangs) drains the node, so this
//! never fails and never blocks: mounts the user left at or below the
//! folder (a FUSE mount, perhaps of a stopped daemon) are detached lazily
//! (`MNT_DETACH`, the path reached without following a link); then the
//! tree is removed through descriptors, following no symlink and crossing
//! no mount point (`RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`); what cannot
//! be removed is reported, not retried; and the whole walk runs on a
//! thread the epilog waits for at most [`CLEANUP_WAIT`].

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::container::safepath::open_below;

/// How long the epilog waits for the removal.
pub const CLEANUP_WAIT: Duration = Duration::from_secs(20);

/// The deepest folder level removed (a deeper tree is left, and reported).
const MAX_DEPTH: usize = 128;

/// What a removal did.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Whether the folder was there.
    pub found: bool,
    /// Mount points detached.
    pub detached: Vec<PathBuf>,
    /// What was left, and why (for the node's log).
    pub left: Vec<String>,
}

/// Removes `dir` (a job's folder in the root-owned fan-out folder), on a
/// thread waited for at most `wait`; never fails: what went wrong is in
/// [`Cleanup::left`].
pub fn remove_job_dir(dir: &Path, wait: Duration) -> Cleanup {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("berth-fanout-cleanup".into())
        .spawn(move || {
            let _ = tx.send(remove_now(&owned));
        });
    if let Err(e) = spawned {
        return Cleanup {
            found: true,
            left: vec![format!(
                "cannot start the removal of {}: {e}",
                dir.display()
            )],
            ..Cleanup::default()
        };
    }
    rx.recv_timeout(wait).unwrap_or_else(|_| Cleanup {
        found: true,
        left: vec![format!(
            "the removal of {} did not end within {} s (a hung file system inside?); left it",
            dir.display(),
            wait.as_secs()
        )],
        ..Cleanup::default()
    })
}

/// The removal itself, on the calling thread.
fn remove_now(dir: &Path) -> Cleanup {
    let mut report = Cleanup::default();
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        report
            .left
            .push(format!("{} has no parent folder", dir.display()));
        return report;
    };
    let parent_fd = match File::open(parent) {
        Ok(f) => OwnedFd::from(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return report,
        Err(e) => {
            report
                .left
                .push(format!("cannot open {}: {e}", parent.display()));
            return report;
        }
    };
    detach_mounts(dir, parent_fd.as_fd(), &mut report);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV;
    let job_fd = match open_below(parent_fd.as_fd(), Path::new(name), flags, resolve) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return report,
        Err(e) => {
            report.found = true;
            report
                .left
                .push(format!("cannot open {}: {e}", dir.display()));
            return report;
        }
    };
    report.found = true;
    empty_dir(job_fd.as_fd(), dir, 0, &mut report);
    if let Err(e) = unlinkat(Some(parent_fd.as_raw_fd()), name, UnlinkatFlags::RemoveDir) {
        report
            .left
            .push(format!("cannot remove {}: {e}", dir.display()));
    }
    report
}

/// Removes everything in the open folder `dir` (at `path`, for messages).
fn empty_dir(dir: BorrowedFd<'_>, path: &Path, depth: usize, report: &mut Cleanup) {
    let names = match entry_names(dir) {
        Ok(names) => names,
        Err(e) => {
            report
                .left
                .push(format!("cannot list {}: {e}", path.display()));
            return;
        }
    };
    for name in names {
        let here = path.join(&name);
        match unlinkat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        ) {
            Ok(()) | Err(Errno::ENOENT) => continue,
            Err(Errno::EISDIR) | Err(Errno::EPERM) => {}
            Err(e) => {
                report
                    .left
                    .push(format!("cannot remove {}: {e}", here.display()));
                continue;
            }
        }
        if depth >= MAX_DEPTH {
            report.left.push(format!(
                "{} is more than {MAX_DEPTH} folders deep; left it",
                here.display()
            ));
            continue;
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV;
        match open_below(dir, Path::new(&name), flags, resolve) {
            Ok(child) => empty_dir(child.as_fd(), &here, depth + 1, report),
            Err(e) => {
                report
                    .left
                    .push(format!("cannot open {}: {e}", here.display()));
                continue;
            }
        }
        if let Err(e) = unlinkat(
            Some(dir.as_raw_fd()),
            name.as_os_str(),
            UnlinkatFlags::RemoveDir,
        ) {
            report
                .left
                .push(format!("cannot remove {}: {e}", here.display()));
        }
    }
}

/// The names in the open folder `dir` (without `.` and `..`), listed
/// through `/proc/self/fd`, which names exactly that folder.
fn entry_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect()
}

/// Detaches every mount at or below `dir` (from `/proc/self/mountinfo`),
/// the shallowest first (a detach takes the mounts below it along). The
/// mount point is reached through its parent folder opened below `dir`'s
/// parent without following a link, so a link the user swapped in cannot
/// point the detach at another mount.
fn detach_mounts(dir: &Path, parent: BorrowedFd<'_>, report: &mut Cleanup) {
    let Ok(mountinfo) = std::fs::read("/proc/self/mountinfo") else {
        return;
    };
    let Some(base) = dir.parent() else {
        return;
    };
    let mut points: Vec<PathBuf> = mount_points(&mountinfo)
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| p.components().count());
    points.dedup();
    let mut done: Vec<PathBuf> = Vec::new();
    for point in points {
        if done.iter().any(|d| point.starts_with(d)) {
            continue;
        }
        match detach_one(parent, base, &point) {
            Ok(()) => {
                done.push(point.clone());
                report.detached.push(point);
            }
            Err(e) => report
                .left
                .push(format!("cannot detach the mount {}: {e}", point.display())),
        }
    }
}

/// Detaches the mount at `point` (below `base`, whose descriptor is `base_fd`).
fn detach_one(base_fd: BorrowedFd<'_>, base: &Path, point: &Path) -> io::Result<()> {
    let relative = point.strip_prefix(base).map_err(io::Error::other)?;
    let (Some(folder), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Err(io::Error::other("not below the fan-out folder"));
    };
    let flags = libc::O_PATH | libc::O_DIRECTORY;
    let resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_XDEV;
    let folder_fd = if folder.as_os_str().is_empty() {
        base_fd.try_clone_to_owned()?
    } else {
        open_below(base_fd, folder, flags, resolve)?
    };
    let target = format!("/proc/self/fd/{}/", folder_fd.as_raw_fd());
    let mut bytes = target.into_bytes();
    bytes.extend_from_slice(name.as_bytes());
    let target = CString::new(bytes).map_err(io::Error::other)?;
    // SAFETY: umount2 with a valid NUL-terminated path and constant flags;
    // it does not touch our memory otherwise.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The mount points (field 5) of a `/proc/PID/mountinfo` text, with its
/// octal escapes (`\040` for a space) decoded.
fn mount_points(mountinfo: &[u8]) -> Vec<PathBuf> {
    mountinfo
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(|field| PathBuf::from(OsStr::from_bytes(&unescape(field))))
        .collect()
}

fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        let info = b"36 25 0:32 / /tmp/a\\040b rw - tmpfs t rw\n37 25 0:33 / /x rw - t t rw\n";
        assert_eq!(
            mount_points(info),
            vec![PathBuf::from("/tmp/a b"), PathBuf::from("/x")]
        );
    }

    /// A link in the folder is removed, never followed; files and folders go.
    #[test]
    fn removes_without_following_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let job = tmp.path().join("job-1");
        std::fs::create_dir_all(job.join("a/b")).unwrap();
        std::fs::write(job.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, job.join("a/link")).unwrap();
        nix::unistd::mkfifo(&job.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let report = remove_job_dir(&job, CLEANUP_WAIT);
        assert!(report.found && report.left.is_empty(), "{report:?}");
        assert!(!job.exists());
        assert!(outside.join("keep").exists(), "the link's target stays");
        let again = remove_job_dir(&job, CLEANUP_WAIT);
        assert!(!again.found, "{again:?}");
    }
}
