//! The job's own mount namespace of Slurm's `job_container/tmpfs`.
//!
//! With `JobContainerType=job_container/tmpfs`, slurmd gives each job a
//! mount namespace with a private `/tmp` and `/dev/shm`, pinned by a bind
//! mount of its nsfs file at `BasePath/JOBID/.ns`, and every task of the job
//! enters it before it execs. Slurm 22.05 (and later releases without
//! `SlurmdParameters=contain_spank`) runs the SPANK callbacks outside it, so
//! a holder that built the container from slurmstepd's namespace would bind
//! the node's `/tmp` and `/dev/shm` into it: the container would see the
//! node's files, not the job's. The holder therefore enters the job's
//! namespace first ([`enter`]), and the container is copied from it.
//!
//! The namespace is found in this process's mount table ([`find`]): only
//! root can mount an nsfs file, so a match is Slurm's; the opened file is
//! checked to be a mount namespace before it is entered.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nix::sched::{setns, CloneFlags};

/// `NSFS_MAGIC` of `<linux/magic.h>`: the file system of namespace files.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// `NS_GET_NSTYPE` of `<linux/nsfs.h>` (`_IO(0xb7, 0x3)`).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The nsfs file pinning job `job`'s mount namespace, when this node runs
/// `job_container/tmpfs` for it (`None` otherwise).
pub fn find(job: u32) -> Option<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    find_in(&table, job)
}

/// [`find`] over the text of a `mountinfo` file.
fn find_in(mountinfo: &str, job: u32) -> Option<PathBuf> {
    let suffix = format!("/{job}/.ns");
    mountinfo.lines().find_map(|line| {
        let (fields, rest) = line.split_once(" - ")?;
        let fstype = rest.split(' ').next()?;
        let mount_point = unescape(fields.split(' ').nth(4)?);
        (fstype == "nsfs" && mount_point.ends_with(&suffix)).then(|| PathBuf::from(mount_point))
    })
}

/// A `mountinfo` path with its octal escapes (`\040` for a space) undone.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Moves this (single-threaded, root) process into the mount namespace
/// pinned at `path`, which must be an nsfs file of a mount namespace. The
/// working folder becomes that namespace's `/`.
pub fn enter(path: &Path) -> anyhow::Result<()> {
    let what = || {
        format!(
            "the job's mount namespace {} (job_container/tmpfs)",
            path.display()
        )
    };
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("cannot open {}", what()))?;
    check_is_mount_namespace(&file).with_context(|| format!("refusing {}", what()))?;
    setns(&file, CloneFlags::CLONE_NEWNS).with_context(|| format!("cannot enter {}", what()))?;
    std::env::set_current_dir("/").context("cannot change to / in the job's mount namespace")?;
    Ok(())
}

/// Fails unless `file` is a namespace file of a mount namespace.
fn check_is_mount_namespace(file: &File) -> anyhow::Result<()> {
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a pointer to a statfs we own.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error()).context("fstatfs");
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 here, other widths elsewhere
    let magic = fs.f_type as i64;
    if magic != NSFS_MAGIC {
        bail!("not a namespace file (file system magic {magic:#x})");
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor.
    let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    if kind < 0 {
        return Err(std::io::Error::last_os_error()).context("NS_GET_NSTYPE");
    }
    if kind != libc::CLONE_NEWNS {
        bail!("a namespace of another kind ({kind:#x}), not a mount namespace");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
98 30 0:4 mnt:[4026532601] /var/spool/jc/41/.ns rw - nsfs nsfs rw
99 30 0:4 mnt:[4026532602] /var/spool/with\\040space/7/.ns rw - nsfs nsfs rw
100 30 8:1 / /scratch/141/.ns rw - ext4 /dev/sda1 rw
";

    #[test]
    fn the_jobs_namespace_file_is_found_by_job_id() {
        assert_eq!(
            find_in(TABLE, 41),
            Some(PathBuf::from("/var/spool/jc/41/.ns"))
        );
        assert_eq!(
            find_in(TABLE, 7),
            Some(PathBuf::from("/var/spool/with space/7/.ns"))
        );
        // Another job's namespace, and a non-nsfs mount at such a path.
        assert_eq!(find_in(TABLE, 1), None);
        assert_eq!(find_in(TABLE, 141), None);
    }

    #[test]
    fn only_a_mount_namespace_file_is_accepted() {
        let own = File::open("/proc/self/ns/mnt").unwrap();
        check_is_mount_namespace(&own).unwrap();
        let net = File::open("/proc/self/ns/net").unwrap();
        let err = check_is_mount_namespace(&net).unwrap_err();
        assert!(format!("{err:#}").contains("another kind"), "{err:#}");
        let plain = File::open("/proc/self/status").unwrap();
        let err = check_is_mount_namespace(&plain).unwrap_err();
        assert!(
            format!("{err:#}").contains("not a namespace file"),
            "{err:#}"
        );
    }
}
