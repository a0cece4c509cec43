//! The mount operations the holder performs, one function per kind, each
//! failing with a message that names the step and the paths.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::container::safepath::{Kind, RootDir};
use crate::container::spec::MountSpec;

/// Host paths every container gets, bound at the same place inside, and
/// whether read-only. `/dev` brings `/dev/shm` and `/dev/pts` along.
const SYSTEM_BINDS: &[(&str, bool)] = &[
    ("/proc", false),
    ("/sys", false),
    ("/dev", false),
    ("/tmp", false),
    ("/etc/hosts", true),
    ("/etc/resolv.conf", true),
];

/// The host binds every container gets, skipping the ones the host lacks
/// (a host without `/etc/resolv.conf`, say).
pub fn system_binds() -> Vec<MountSpec> {
    SYSTEM_BINDS
        .iter()
        .filter(|(path, _)| Path::new(path).exists())
        .map(|(path, read_only)| MountSpec {
            read_only: *read_only,
            ..MountSpec::same_path(path)
        })
        .collect()
}

/// Makes every mount of the current namespace private, so nothing we mount
/// propagates back to the host (and nothing from the host reaches us).
pub fn make_all_private() -> anyhow::Result<()> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("cannot make the mounts of the new mount namespace private (mount --make-rprivate /)")
}

/// Mounts a fresh tmpfs (mode 0755) on `target`.
pub fn mount_tmpfs(target: &Path) -> anyhow::Result<()> {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )
    .with_context(|| format!("cannot mount a tmpfs on {}", target.display()))
}

/// Mounts the squashfs on block device `device` read-only on `target`.
pub fn mount_squashfs(device: &Path, image: &Path, target: &Path) -> anyhow::Result<()> {
    mount(
        Some(device),
        target,
        Some("squashfs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .with_context(|| {
        format!(
            "cannot mount image {} ({}) as squashfs on {}: is it a squashfs file, \
             and is the squashfs kernel module available?",
            image.display(),
            device.display(),
            target.display()
        )
    })
}

/// Mounts an overlay of `lower` (read-only) and `upper`/`work` on `target`.
pub fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> anyhow::Result<()> {
    for dir in [lower, upper, work] {
        let text = dir.to_string_lossy();
        if text.contains([',', ':', '\\']) {
            bail!(
                "cannot use {} as an overlay layer: its path contains ',', ':' or '\\'",
                dir.display()
            );
        }
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .with_context(|| {
        format!(
            "cannot mount the overlay ({options}) on {}",
            target.display()
        )
    })
}

/// Creates the mount point for `bind` inside `root`: a directory or an empty
/// file, like its source. Fails when the source does not exist.
pub fn create_mount_point(root: &RootDir, bind: &MountSpec) -> anyhow::Result<()> {
    let meta = std::fs::metadata(&bind.source).with_context(|| {
        format!(
            "mount source {} does not exist or cannot be read (mount {} -> {})",
            bind.source.display(),
            bind.source.display(),
            bind.target.display()
        )
    })?;
    let kind = if meta.is_dir() { Kind::Dir } else { Kind::File };
    root.ensure(&bind.target, kind).with_context(|| {
        format!(
            "cannot create mount point {} in the container for {}",
            bind.target.display(),
            bind.source.display()
        )
    })?;
    Ok(())
}

/// Bind-mounts (recursively) `bind.source` from the host onto `bind.target`
/// inside `root`, read-only if asked. The source is resolved with the caller's
/// own permissions; the target is resolved safely inside `root`, after the
/// binds made before (so nested targets land on the outer bind).
///
/// Uses the mount API of Linux 5.2: the source tree is cloned detached
/// (open_tree), made read-only there if asked (so it is never writable in the
/// container, not even for a moment), then attached onto the resolved target
/// descriptor (move_mount), with no second lookup of the target path.
pub fn bind_into(root: &RootDir, bind: &MountSpec) -> anyhow::Result<()> {
    let describe = || format!("{} -> {}", bind.source.display(), bind.target.display());
    let target = root.resolve(&bind.target).with_context(|| {
        format!(
            "bind mount {}: cannot find mount point {} in the container",
            describe(),
            bind.target.display()
        )
    })?;
    let tree = clone_tree(&bind.source).with_context(|| {
        format!(
            "cannot bind-mount {}: check that the source exists and that you may read it",
            describe()
        )
    })?;
    if bind.read_only {
        set_read_only(tree.as_fd())
            .with_context(|| format!("cannot make bind mount {} read-only", describe()))?;
    }
    attach_tree(tree.as_fd(), target.as_fd())
        .with_context(|| format!("cannot attach bind mount {}", describe()))
}

/// open_tree(2) with OPEN_TREE_CLONE | AT_RECURSIVE: a detached copy of the
/// mount tree at `source`.
fn clone_tree(source: &Path) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let source = CString::new(source.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: `source` is a valid NUL-terminated path that outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, source.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// move_mount(2) of the detached tree `tree` onto the object `target` names.
fn attach_tree(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    let empty = b"\0".as_ptr().cast::<libc::c_char>();
    // SAFETY: both descriptors are valid and both paths are the empty C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty,
            target.as_raw_fd(),
            empty,
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the mount at `mount_root` and every mount below it read-only
/// (mount_setattr(2), which keeps the other mount flags as they are).
pub fn set_read_only(mount_root: BorrowedFd<'_>) -> io::Result<()> {
    /// `struct mount_attr` of `<linux/mount.h>`.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the path is a valid empty C string, `attr` is a valid mount_attr
    // whose size we pass, and both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount_root.as_raw_fd(),
            b"\0".as_ptr().cast::<libc::c_char>(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `new_root` the root of the current mount namespace and detaches the
/// old root with everything under it; the working directory ends up at `/`.
///
/// `new_root` is first bind-mounted onto itself: pivot_root(2) refuses a root
/// that is not a mount of this namespace's own (EINVAL in a new user namespace).
pub fn pivot_into(new_root: &Path) -> anyhow::Result<()> {
    mount(
        Some(new_root),
        new_root,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .with_context(|| {
        format!(
            "cannot bind the container root {} onto itself",
            new_root.display()
        )
    })?;
    nix::unistd::chdir(new_root)
        .with_context(|| format!("cannot enter the container root {}", new_root.display()))?;
    nix::unistd::pivot_root(".", ".")
        .with_context(|| format!("cannot pivot_root into {}", new_root.display()))?;
    umount2(".", MntFlags::MNT_DETACH).context("cannot detach the old root after pivot_root")?;
    nix::unistd::chdir("/").context("cannot change to / in the container")?;
    Ok(())
}

/// Directory names under a staging directory.
#[derive(Debug, Clone)]
pub struct StagingPaths {
    /// Where the image is mounted.
    pub lower: PathBuf,
    /// The overlay's upper (writable) layer.
    pub upper: PathBuf,
    /// The overlay's work directory.
    pub work: PathBuf,
    /// Where the container's root file system is assembled.
    pub root: PathBuf,
}

impl StagingPaths {
    /// The paths under `base`.
    pub fn under(base: &Path) -> StagingPaths {
        StagingPaths {
            lower: base.join("lower"),
            upper: base.join("upper"),
            work: base.join("work"),
            root: base.join("root"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_binds_make_hosts_and_resolv_read_only() {
        let binds = system_binds();
        for bind in &binds {
            assert_eq!(bind.source, bind.target);
            let ro = bind.source.starts_with("/etc");
            assert_eq!(bind.read_only, ro, "{bind:?}");
        }
        assert!(binds.iter().any(|b| b.source == Path::new("/proc")));
    }

    #[test]
    fn overlay_refuses_paths_with_separators() {
        let err = mount_overlay(
            Path::new("/a,b"),
            Path::new("/u"),
            Path::new("/w"),
            Path::new("/t"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/a,b"), "{err}");
    }
}
