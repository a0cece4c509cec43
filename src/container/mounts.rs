//! The mount operations the holder performs, one function per kind, each
//! failing with a message that names the step and the paths.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::container::mountplan::RootStep;
use crate::container::safepath::{Kind, RootDir};
use crate::container::spec::{MountKind, MountSpec, Propagation, UserIdentity, UserMount};

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

/// Mounts a read-only overlay of `lowers` (the first on top) on `target`.
pub fn mount_overlay_read_only(lowers: &[&Path], target: &Path) -> anyhow::Result<()> {
    for dir in lowers {
        if dir.to_string_lossy().contains([',', ':', '\\']) {
            bail!(
                "cannot use {} as an overlay layer: its path contains ',', ':' or '\\'",
                dir.display()
            );
        }
    }
    let joined: Vec<String> = lowers.iter().map(|d| d.display().to_string()).collect();
    let options = format!("lowerdir={}", joined.join(":"));
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .with_context(|| {
        format!(
            "cannot mount the read-only overlay ({options}) on {}",
            target.display()
        )
    })
}

/// Creates the mount point for `mount` inside `root`: a directory or an empty
/// file, like a bind's source (a file or a character device gets a file); a
/// directory for a tmpfs; nothing for an unmount. Fails when a bind's source
/// does not exist.
pub fn create_mount_point(root: &RootDir, mount: &UserMount) -> anyhow::Result<()> {
    if let Some(kind) = mount_point_kind(mount)? {
        ensure_mount_point(root, mount, kind)?;
    }
    Ok(())
}

/// [`create_mount_point`] for a mount of the user's (`--container-mounts`),
/// made while the holder is still root: the source is looked at with
/// `user`'s file-system identity, so the answer (and the error) is the one
/// the user would get, and says nothing about paths the user cannot see.
pub fn create_user_mount_point(
    root: &RootDir,
    mount: &UserMount,
    user: &crate::container::spec::UserIdentity,
) -> anyhow::Result<()> {
    let kind = crate::container::loopdev::as_reader(user, || Ok(mount_point_kind(mount)))??;
    if let Some(kind) = kind {
        ensure_mount_point(root, mount, kind)?;
    }
    Ok(())
}

/// What the mount point of `mount` must be; `None` for an unmount.
fn mount_point_kind(mount: &UserMount) -> anyhow::Result<Option<Kind>> {
    let kind = match mount.kind {
        MountKind::Umount => return Ok(None),
        MountKind::Tmpfs => Kind::Dir,
        MountKind::Bind => {
            // Relative sources are resolved before the holder starts; one
            // left here would be taken from the holder's own directory.
            if mount.source.is_relative() {
                anyhow::bail!(
                    "mount source {} is relative (mount {}); give an absolute path",
                    mount.source.display(),
                    describe(mount)
                );
            }
            let meta = std::fs::metadata(&mount.source).with_context(|| {
                format!(
                    "mount {}: source path does not exist or cannot be read: {}",
                    describe(mount),
                    mount.source.display()
                )
            })?;
            if meta.is_dir() {
                Kind::Dir
            } else {
                Kind::File
            }
        }
    };
    Ok(Some(kind))
}

fn ensure_mount_point(root: &RootDir, mount: &UserMount, kind: Kind) -> anyhow::Result<OwnedFd> {
    root.ensure(&mount.target, kind).with_context(|| {
        format!(
            "cannot create mount point {} in the container (mount {})",
            mount.target.display(),
            describe(mount)
        )
    })
}

/// `'SRC:DST'`, as in `--container-mounts`, for messages.
fn describe(mount: &UserMount) -> String {
    format!("'{}:{}'", mount.source.display(), mount.target.display())
}

/// Applies one mount inside `root`: a bind, a tmpfs, or an unmount, with its
/// flags and propagation. Targets are resolved safely inside `root`, after the
/// mounts made before (so nested targets land on the outer mount, and a
/// missing one is created there, with the caller's permissions).
pub fn apply(root: &RootDir, mount: &UserMount) -> anyhow::Result<()> {
    apply_with(root, mount, None)
}

/// [`apply`] for a mount of the user's, made by root before the container's
/// user namespace exists, so that the container can neither remount nor
/// unmount it (the kernel locks mounts that a less privileged namespace
/// inherits: `MNT_LOCK_READONLY`, `MNT_LOCKED`). The kernel still checks
/// the user's permissions: the source is looked up, and missing mount
/// points are created, with `user`'s file-system identity; a tmpfs gets the
/// user as its owner. Propagation is left for [`set_user_propagation`],
/// after the recursive bind of the root that would drop unbindable mounts.
pub fn apply_as_user(root: &RootDir, mount: &UserMount, user: &UserIdentity) -> anyhow::Result<()> {
    let mut mount = mount.clone();
    mount.flags.propagation = None;
    if mount.kind == MountKind::Tmpfs {
        for (key, id) in [("uid", user.uid), ("gid", user.gid)] {
            let prefix = format!("{key}=");
            if !mount.tmpfs_options.iter().any(|o| o.starts_with(&prefix)) {
                mount.tmpfs_options.push(format!("{prefix}{id}"));
            }
        }
    }
    apply_with(root, &mount, Some(user))
}

/// Sets the propagation the user asked for on `mount` (already mounted by
/// [`apply_as_user`]); nothing when none was asked.
pub fn set_user_propagation(root: &RootDir, mount: &UserMount) -> anyhow::Result<()> {
    let Some(propagation) = mount.flags.propagation else {
        return Ok(());
    };
    let attached = root
        .resolve(&mount.target)
        .with_context(|| format!("mount {}: cannot find it after mounting", describe(mount)))?;
    set_propagation(
        attached.as_fd(),
        propagation,
        mount.flags.recursive_propagation,
    )
    .with_context(|| {
        format!(
            "cannot set propagation {propagation:?} on mount {}",
            describe(mount)
        )
    })
}

/// [`apply`]; with `user`, paths are looked at (and mount points created)
/// with that user's file-system identity.
fn apply_with(
    root: &RootDir,
    mount: &UserMount,
    user: Option<&UserIdentity>,
) -> anyhow::Result<()> {
    let as_user = |f: &mut dyn FnMut() -> anyhow::Result<OwnedFd>| match user {
        Some(user) => crate::container::loopdev::as_reader(user, || Ok(f()))?,
        None => f(),
    };
    let target = match mount_point_kind(mount)? {
        Some(kind) => as_user(&mut || ensure_mount_point(root, mount, kind))?,
        None => root.resolve(&mount.target).with_context(|| {
            format!(
                "mount {}: nothing to unmount, {} does not exist in the container",
                describe(mount),
                mount.target.display()
            )
        })?,
    };
    match mount.kind {
        MountKind::Bind => bind_tree(&mount.source, target.as_fd(), attributes_of(mount), user)
            .with_context(|| format!("cannot bind-mount {}", describe(mount)))?,
        MountKind::Tmpfs => mount_tmpfs_at(target.as_fd(), mount)
            .with_context(|| format!("cannot mount a tmpfs on {}", mount.target.display()))?,
        MountKind::Umount => {
            return umount2(fd_path(target.as_fd()).as_str(), MntFlags::MNT_DETACH).with_context(
                || {
                    format!(
                        "cannot unmount {} in the container (umount:{}): is anything mounted \
                         there?",
                        mount.target.display(),
                        mount.target.display()
                    )
                },
            )
        }
    }
    // The descriptor taken before names the mount point under the new
    // mount: set_user_propagation resolves again to reach the new mount.
    set_user_propagation(root, mount)
}

/// The `/proc/self/fd/N` path of a descriptor, which the mount calls follow
/// to the object itself (no second lookup of the path inside the root).
fn fd_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Mounts a tmpfs with the mount's options and flags on `target`.
fn mount_tmpfs_at(target: BorrowedFd<'_>, mount: &UserMount) -> anyhow::Result<()> {
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if mount.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    if mount.flags.noexec {
        flags |= MsFlags::MS_NOEXEC;
    }
    let options = mount.tmpfs_options.join(",");
    nix::mount::mount(
        Some("tmpfs"),
        fd_path(target).as_str(),
        Some("tmpfs"),
        flags,
        Some(options.as_str()),
    )
    .with_context(|| format!("tmpfs options '{options}'"))
}

/// Bind-mounts (recursively) `bind.source` from the host onto `bind.target`
/// inside `root`, read-only if asked. See [`apply`].
pub fn bind_into(root: &RootDir, bind: &MountSpec) -> anyhow::Result<()> {
    apply(root, &UserMount::from(bind.clone()))
}

/// Makes one of a root holder's planned steps in `root`: a mount with
/// [`apply`], or a symbolic link (created where the link's folder resolves
/// inside the root, never through a link of the image's).
pub fn make_root_step(root: &RootDir, step: &RootStep) -> anyhow::Result<()> {
    match step {
        RootStep::Mount { mount, context, .. } => apply(root, mount).with_context(|| {
            context
                .clone()
                .unwrap_or_else(|| format!("cannot mount {}", step.table_line()))
        }),
        RootStep::Symlink { target, link, .. } => {
            let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
                bail!("cannot create the link {}: no folder", target.display());
            };
            let dir = root
                .resolve(parent)
                .with_context(|| format!("cannot open {} in the container", parent.display()))?;
            let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
            std::os::unix::fs::symlink(link, &at)
                .with_context(|| format!("cannot create the link {}", target.display()))
        }
    }
}

/// Attributes to set on a new mount (mount_setattr(2) `MOUNT_ATTR_*` bits).
fn attributes_of(mount: &UserMount) -> u64 {
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_NOEXEC: u64 = 0x8;
    [
        (mount.read_only, MOUNT_ATTR_RDONLY),
        (mount.flags.nosuid, MOUNT_ATTR_NOSUID),
        (mount.flags.nodev, MOUNT_ATTR_NODEV),
        (mount.flags.noexec, MOUNT_ATTR_NOEXEC),
    ]
    .into_iter()
    .filter(|(wanted, _)| *wanted)
    .fold(0, |bits, (_, bit)| bits | bit)
}

/// Binds the host tree at `source` onto `target`.
///
/// Uses the mount API of Linux 5.2: the source tree is cloned detached
/// (open_tree, the source resolved with the caller's own permissions), given
/// its attributes there (so it is never writable in the container, not even
/// for a moment, when read-only), then attached onto the target descriptor
/// (move_mount), with no second lookup of the target path.
fn bind_tree(
    source: &Path,
    target: BorrowedFd<'_>,
    attributes: u64,
    user: Option<&UserIdentity>,
) -> anyhow::Result<()> {
    let tree = match user {
        Some(user) => crate::container::loopdev::as_reader(user, || clone_tree(source)),
        None => clone_tree(source),
    }
    .with_context(|| {
        format!(
            "check that {} exists and that you may read it",
            source.display()
        )
    })?;
    if attributes != 0 {
        set_attributes(tree.as_fd(), attributes, 0, true)
            .context("cannot set the mount flags (ro, nosuid, nodev, noexec)")?;
    }
    attach_tree(tree.as_fd(), target).context("cannot attach the mount")
}

/// Bind-mounts the mount at (or the folder) `source`, without the mounts
/// below it, onto `target` with the id mapping of user namespace `userns`
/// (an idmapped mount, see [`crate::container::idmap`]). The clone is
/// mapped while still detached, so `target` never shows the unmapped ids.
pub fn bind_idmapped(source: &Path, target: &Path, userns: BorrowedFd<'_>) -> io::Result<()> {
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let tree = clone_tree_of(source, false)?;
    set_attributes_with(tree.as_fd(), MOUNT_ATTR_IDMAP, 0, false, Some(userns))?;
    let target = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(target)?;
    attach_tree(tree.as_fd(), target.as_fd())
}

/// open_tree(2) with OPEN_TREE_CLONE | AT_RECURSIVE: a detached copy of the
/// mount tree at `source`.
fn clone_tree(source: &Path) -> io::Result<OwnedFd> {
    clone_tree_of(source, true)
}

/// open_tree(2) with OPEN_TREE_CLONE: a detached copy of the mount at
/// `source`, with the mounts below it when `recursive`.
fn clone_tree_of(source: &Path, recursive: bool) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let source = CString::new(source.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
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
    let empty = c"".as_ptr();
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
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    set_attributes(mount_root, MOUNT_ATTR_RDONLY, 0, true)
}

/// Makes the mount whose root `mount_root` is (only that mount, not the ones
/// below it) read-only.
pub fn make_mount_read_only(mount_root: BorrowedFd<'_>) -> io::Result<()> {
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    set_attributes(mount_root, MOUNT_ATTR_RDONLY, 0, false)
}

/// Makes the root mount of the current mount namespace (only that mount, not
/// the ones below it) read-only.
pub fn make_root_read_only() -> anyhow::Result<()> {
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    let root = std::fs::File::open("/").context("cannot open / of the container")?;
    set_attributes(root.as_fd(), MOUNT_ATTR_RDONLY, 0, false)
        .context("cannot make the container's root file system read-only")
}

/// Sets the propagation of the mount at `mount_root` (and below it when
/// `recursive`).
fn set_propagation(
    mount_root: BorrowedFd<'_>,
    propagation: Propagation,
    recursive: bool,
) -> io::Result<()> {
    let flag = match propagation {
        Propagation::Private => libc::MS_PRIVATE,
        Propagation::Slave => libc::MS_SLAVE,
        Propagation::Shared => libc::MS_SHARED,
        Propagation::Unbindable => libc::MS_UNBINDABLE,
    };
    set_attributes(mount_root, 0, flag, recursive)
}

/// mount_setattr(2): adds the `MOUNT_ATTR_*` bits `set` and, when not 0, sets
/// propagation `propagation` (`MS_PRIVATE`, ...) on the mount at `mount_root`,
/// and on every mount below it when `recursive`.
fn set_attributes(
    mount_root: BorrowedFd<'_>,
    set: u64,
    propagation: u64,
    recursive: bool,
) -> io::Result<()> {
    set_attributes_with(mount_root, set, propagation, recursive, None)
}

/// [`set_attributes`], with the user namespace whose mapping
/// `MOUNT_ATTR_IDMAP` takes.
fn set_attributes_with(
    mount_root: BorrowedFd<'_>,
    set: u64,
    propagation: u64,
    recursive: bool,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    /// `struct mount_attr` of `<linux/mount.h>`.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    // SAFETY: the path is a valid empty C string, `attr` is a valid mount_attr
    // whose size we pass, and both outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount_root.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bind-mounts `new_root` (with the mounts below it) onto itself, so that it
/// is a mount of the current namespace's own: pivot_root(2) refuses a root
/// that is not (EINVAL in a new user namespace). Done before the user's
/// mounts are added on top: a recursive bind leaves out unbindable mounts.
pub fn bind_onto_itself(new_root: &Path) -> anyhow::Result<()> {
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
    })
}

/// Makes `new_root` (bound onto itself, see [`bind_onto_itself`]) the root of
/// the current mount namespace and detaches the old root with everything
/// under it; the working directory ends up at `/`.
pub fn pivot_into(new_root: &Path) -> anyhow::Result<()> {
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
    /// Where the image's squashfs is mounted (privileged mode).
    pub image: PathBuf,
    /// The overlay's lower layer: the image, idmapped (or, unprivileged,
    /// through squashfuse).
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
            image: base.join("image"),
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
    fn attributes_follow_flags() {
        let mut mount = crate::container::spec::parse_mounts("/a:/b:ro+noexec").unwrap()[0].clone();
        assert_eq!(attributes_of(&mount), 0x1 | 0x8);
        mount.read_only = false;
        mount.flags.noexec = false;
        assert_eq!(attributes_of(&mount), 0);
        mount.flags.nosuid = true;
        mount.flags.nodev = true;
        assert_eq!(attributes_of(&mount), 0x2 | 0x4);
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
