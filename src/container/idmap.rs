//! Idmapped mounts of the image: the image's files, owned by uid 0 and gid 0
//! on disk, are seen as the job's user's, without unpacking or copying.
//!
//! The mapping swaps two ids: on-disk 0 is seen as the user's uid (gid 0 as
//! the primary gid), on-disk user uid as 0, and every other id as itself. A
//! swap is its own inverse, so the same mapping serves both directions: the
//! container's view of the image (and so what overlayfs copies up into the
//! upper folder, and what the user creates there), and `--container-save`,
//! which maps the upper folder's ids back to the image's before packing.
//!
//! The kernel takes the mapping from a user namespace (`mount_setattr(2)`
//! with `MOUNT_ATTR_IDMAP`); [`MappingNamespace`] makes one that no process
//! keeps: a forked child unshares it, the caller (root) writes its maps and
//! opens `/proc/CHILD/ns/user`, and the child exits.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The largest id a user namespace can map (`(uid_t) -1` is invalid).
const MAX_ID: u64 = u32::MAX as u64 - 1;

/// What the kernel needs for the image's files to be the user's; named in the
/// warning when it refuses.
pub const KERNEL_REQUIREMENT: &str =
    "idmapped mounts of squashfs (mount_setattr MOUNT_ATTR_IDMAP) and overlayfs on idmapped \
     layers (Linux 5.19 or later)";

/// The file, beside an on-disk overlay's `upper/` and `work/`, that says the
/// upper folder was written through a mapped image (so its ids are swapped).
const RECORD_FILE: &str = "idmap.json";

/// The ids that [`swap_map`] exchanges with 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdSwap {
    /// The user's uid on the host.
    pub uid: u32,
    /// The user's primary gid on the host.
    pub gid: u32,
}

impl IdSwap {
    /// Whether the mapping changes anything (root's own containers need none).
    pub fn is_identity(&self) -> bool {
        self.uid == 0 && self.gid == 0
    }

    /// Notes in `overlay_dir` (holding `upper/` and `work/`) that its upper
    /// folder holds ids swapped by `self`; `--container-save` reads it.
    pub fn record(&self, overlay_dir: &Path) -> anyhow::Result<()> {
        let path = overlay_dir.join(RECORD_FILE);
        let json = serde_json::to_vec(self).context("cannot encode the id mapping")?;
        std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))
    }

    /// The swap recorded in `overlay_dir`, if any (none: the upper folder was
    /// written without a mapped image, its ids are the image's).
    pub fn recorded(overlay_dir: &Path) -> anyhow::Result<Option<IdSwap>> {
        let path = overlay_dir.join(RECORD_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("cannot read the id mapping in {}", path.display())),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(err).with_context(|| format!("cannot read {}", path.display())),
        }
    }
}

/// The lines of a `uid_map` or `gid_map` ("inside outside count") that
/// exchange 0 and `id` and map every other id to itself.
pub fn swap_map(id: u32) -> String {
    let id = u64::from(id);
    if id == 0 {
        return format!("0 0 {}\n", MAX_ID + 1);
    }
    let mut lines = format!("0 {id} 1\n{id} 0 1\n");
    if id > 1 {
        lines.push_str(&format!("1 1 {}\n", id - 1));
    }
    if id < MAX_ID {
        lines.push_str(&format!("{0} {0} {1}\n", id + 1, MAX_ID - id));
    }
    lines
}

/// A user namespace that carries an id mapping and nothing else.
#[derive(Debug)]
pub struct MappingNamespace {
    fd: OwnedFd,
}

impl MappingNamespace {
    /// A namespace whose maps swap 0 with `swap`'s ids. Needs root (the maps
    /// name ids the caller does not own). The process must be single-threaded:
    /// it forks.
    pub fn swapping(swap: IdSwap) -> io::Result<MappingNamespace> {
        MappingNamespace::with_maps(&swap_map(swap.uid), &swap_map(swap.gid))
    }

    /// A namespace with these `uid_map` and `gid_map` contents.
    pub fn with_maps(uid_map: &str, gid_map: &str) -> io::Result<MappingNamespace> {
        let (mut parent_end, child_end) = UnixStream::pair()?;
        // SAFETY: the caller is single-threaded (the holder and the save
        // helper are); the child only makes raw system calls and exits.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            drop(parent_end);
            child_main(child_end.as_raw_fd());
        }
        drop(child_end);
        let result = write_maps_and_open(pid, &mut parent_end, uid_map, gid_map);
        // Closing our end lets the child exit; reap it whatever happened.
        drop(parent_end);
        let mut status = 0;
        // SAFETY: waiting for our own child, with a valid status pointer.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        result.map(|fd| MappingNamespace { fd })
    }

    /// The namespace's descriptor, for `mount_setattr`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The forked child: a new user namespace, one byte to say so (0 when
/// unshare failed, with errno following), then wait until the parent hangs up.
fn child_main(socket: i32) -> ! {
    // SAFETY: raw system calls on our own descriptor and constant buffers;
    // nothing here allocates or takes locks (we are a fork's child).
    unsafe {
        let report: [u8; 5] = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
            [1, 0, 0, 0, 0]
        } else {
            let errno = *libc::__errno_location();
            let b = errno.to_ne_bytes();
            [0, b[0], b[1], b[2], b[3]]
        };
        libc::write(socket, report.as_ptr().cast(), report.len());
        let mut byte = 0u8;
        libc::read(socket, (&mut byte as *mut u8).cast(), 1);
        libc::_exit(0)
    }
}

fn write_maps_and_open(
    pid: i32,
    socket: &mut UnixStream,
    uid_map: &str,
    gid_map: &str,
) -> io::Result<OwnedFd> {
    let mut report = [0u8; 5];
    socket.read_exact(&mut report)?;
    if report[0] != 1 {
        let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
        return Err(io::Error::from_raw_os_error(errno));
    }
    for (file, content) in [
        ("uid_map", uid_map),
        ("setgroups", "deny"),
        ("gid_map", gid_map),
    ] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(content.as_bytes()))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot write {path}: {e}")))?;
    }
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
    // SAFETY: `into_raw_fd` hands over the descriptor the File owned.
    Ok(unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(ns)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(map: &str) -> Vec<(u64, u64, u64)> {
        map.lines()
            .map(|line| {
                let v: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
                (v[0], v[1], v[2])
            })
            .collect()
    }

    fn apply(map: &[(u64, u64, u64)], id: u64) -> Option<u64> {
        map.iter()
            .find(|(inside, _, count)| id >= *inside && id < inside + count)
            .map(|(inside, outside, _)| outside + (id - inside))
    }

    #[test]
    fn swap_exchanges_zero_and_the_id_and_keeps_the_rest() {
        for id in [1u32, 2, 1000, 65534, u32::MAX - 2, u32::MAX - 1] {
            let map = parse(&swap_map(id));
            assert_eq!(apply(&map, 0), Some(u64::from(id)), "{id}");
            assert_eq!(apply(&map, u64::from(id)), Some(0), "{id}");
            for other in [1u64, 42, 999, 1001, MAX_ID] {
                if other != u64::from(id) {
                    assert_eq!(apply(&map, other), Some(other), "{id}: {other}");
                }
            }
            let total: u64 = map.iter().map(|(_, _, count)| count).sum();
            assert_eq!(total, MAX_ID + 1, "{id}: every id is mapped once");
        }
    }

    #[test]
    fn the_swap_is_recorded_beside_the_upper_folder() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(IdSwap::recorded(dir.path()).unwrap(), None);
        let swap = IdSwap {
            uid: 1001,
            gid: 1002,
        };
        swap.record(dir.path()).unwrap();
        assert_eq!(IdSwap::recorded(dir.path()).unwrap(), Some(swap));
    }

    #[test]
    fn swap_of_zero_is_the_identity() {
        assert_eq!(parse(&swap_map(0)), vec![(0, 0, MAX_ID + 1)]);
        assert!(IdSwap { uid: 0, gid: 0 }.is_identity());
        assert!(!IdSwap { uid: 0, gid: 5 }.is_identity());
    }
}
