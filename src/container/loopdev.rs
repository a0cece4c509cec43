//! Read-only, self-clearing loop devices for squashfs images.
//!
//! A free device comes from `/dev/loop-control` (`LOOP_CTL_GET_FREE`) and is
//! bound to the image with `LOOP_CONFIGURE` (one ioctl; older kernels get
//! `LOOP_SET_FD` + `LOOP_SET_STATUS64`), read-only and with
//! `LO_FLAGS_AUTOCLEAR`: the kernel detaches it when its last user goes away,
//! that is when the file system mounted from it is unmounted and the
//! [`LoopDevice`] has been dropped. Nothing is left behind after a crash.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::container::spec::UserIdentity;
use crate::seal::{check_sealed, SealedFile};

const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;

/// How often to take another free device when a concurrent setup wins the race.
const MAX_ATTEMPTS: usize = 64;

/// `struct loop_info64` of `<linux/loop.h>`.
#[derive(Clone, Copy)]
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// An open loop device bound read-only to an image file.
///
/// Dropping it closes the device; with autoclear the kernel then detaches it as
/// soon as nothing (no mount) uses it any more.
#[derive(Debug)]
pub struct LoopDevice {
    device: File,
    path: PathBuf,
}

impl LoopDevice {
    /// Binds a free loop device read-only to `image`, with autoclear.
    ///
    /// The file is opened with `reader`'s file-system identity, so the
    /// kernel checks for root what it checks for the user: every folder on
    /// the way, ACLs, the file's mode (a world-readable file in another
    /// user's private folder stays theirs). What was opened is then checked
    /// on the open file itself (never the path again, which could have been
    /// swapped): a regular file, so a symlink or a renamed path cannot point
    /// root at a device.
    pub fn attach_read_only(image: &Path, reader: &UserIdentity) -> anyhow::Result<LoopDevice> {
        let backing = open_image(image, reader)?;
        LoopDevice::attach_file(image, &backing)
    }

    /// [`LoopDevice::attach_read_only`] for an image of the node store,
    /// which the pull user wrote: opened with `reader`'s identity, then
    /// bound only when the descriptor shows a sealed file (root's, no write
    /// bits, one link; see [`crate::seal::check_sealed`]) and,
    /// given `sealed`, the very file root sealed for the step.
    pub fn attach_store_image(
        image: &Path,
        reader: &UserIdentity,
        sealed: Option<SealedFile>,
    ) -> anyhow::Result<LoopDevice> {
        let backing = open_image(image, reader)?;
        check_sealed(&backing, image, sealed)?;
        LoopDevice::attach_file(image, &backing)
    }

    /// The device node, e.g. `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Binds a free loop device to the opened `backing` file of `image`.
    fn attach_file(image: &Path, backing: &File) -> anyhow::Result<LoopDevice> {
        let meta = backing
            .metadata()
            .with_context(|| format!("cannot stat image file {}", image.display()))?;
        if !meta.file_type().is_file() {
            bail!(
                "image {} is not a regular file; berth mounts only squashfs files",
                image.display()
            );
        }
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .context(
                "cannot open /dev/loop-control: loop devices need root and the loop \
                 kernel module (modprobe loop)",
            )?;
        let info = loop_info(image);
        for _ in 0..MAX_ATTEMPTS {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns an index.
            let index = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if index < 0 {
                return Err(io::Error::last_os_error())
                    .context("cannot get a free loop device from /dev/loop-control");
            }
            let path = PathBuf::from(format!("/dev/loop{index}"));
            let device = open_device(&path)?;
            match configure(&device, backing, &info) {
                Ok(()) => return Ok(LoopDevice { device, path }),
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => continue,
                Err(err) => {
                    return Err(err).with_context(|| {
                        format!(
                            "cannot bind {} to image {}",
                            path.display(),
                            image.display()
                        )
                    })
                }
            }
        }
        bail!(
            "cannot bind a loop device to image {}: every free device was taken by \
             someone else {MAX_ATTEMPTS} times in a row",
            image.display()
        )
    }
}

/// Opens `image` read-only with `reader`'s file-system identity (see
/// [`LoopDevice::attach_read_only`]).
fn open_image(image: &Path, reader: &UserIdentity) -> anyhow::Result<File> {
    open_as(image, reader).map_err(|e| {
        if e.kind() == io::ErrorKind::PermissionDenied {
            anyhow::anyhow!(
                "image {} is not readable by {} (uid {}): {e}; berth mounts only \
                     images the job's user may read",
                image.display(),
                reader.name,
                reader.uid
            )
        } else {
            anyhow::Error::new(e).context(format!("cannot open image file {}", image.display()))
        }
    })
}

impl AsRawFd for LoopDevice {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.device.as_raw_fd()
    }
}

fn loop_info(image: &Path) -> LoopInfo64 {
    // SAFETY: LoopInfo64 is plain integers and byte arrays: all-zero is valid.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    info.lo_flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
    let name = image.as_os_str().as_bytes();
    let len = name.len().min(LO_NAME_SIZE - 1);
    info.lo_file_name[..len].copy_from_slice(&name[..len]);
    info
}

fn open_device(path: &Path) -> anyhow::Result<File> {
    // The node may appear a moment after LOOP_CTL_GET_FREE created the device.
    for _ in 0..100 {
        match OpenOptions::new().read(true).open(path) {
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => {
                return other.with_context(|| format!("cannot open loop device {}", path.display()))
            }
        }
    }
    bail!("loop device {} did not appear in /dev", path.display())
}

/// Binds `device` to `backing`: LOOP_CONFIGURE, or the two legacy ioctls on
/// kernels without it (before 5.8).
fn configure(device: &File, backing: &File, info: &LoopInfo64) -> io::Result<()> {
    match configure_at_once(device, backing, info) {
        Err(err) if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOTTY)) => {
            configure_legacy(device, backing, info)
        }
        other => other,
    }
}

fn configure_at_once(device: &File, backing: &File, info: &LoopInfo64) -> io::Result<()> {
    // SAFETY: LoopConfig is plain integers and byte arrays: all-zero is valid.
    let mut config: LoopConfig = unsafe { std::mem::zeroed() };
    config.fd = backing.as_raw_fd() as u32;
    config.info = *info;
    // SAFETY: LOOP_CONFIGURE reads one struct loop_config, which outlives the call.
    let ret = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE,
            &config as *const LoopConfig,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn configure_legacy(device: &File, backing: &File, info: &LoopInfo64) -> io::Result<()> {
    // SAFETY: LOOP_SET_FD takes the backing file descriptor by value. The
    // device is read-only because the backing file was opened read-only.
    if unsafe { libc::ioctl(device.as_raw_fd(), LOOP_SET_FD, backing.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: LOOP_SET_STATUS64 reads one struct loop_info64, which outlives the call.
    let ret = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_SET_STATUS64,
            info as *const LoopInfo64,
        )
    };
    if ret != 0 {
        let err = io::Error::last_os_error();
        // SAFETY: LOOP_CLR_FD takes no argument; it undoes our LOOP_SET_FD.
        unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD, 0) };
        return Err(err);
    }
    Ok(())
}

/// Opens `image` read-only and non-blocking (a FIFO cannot stall the
/// caller) as `reader` would; see [`as_reader`].
pub(crate) fn open_as(image: &Path, reader: &UserIdentity) -> io::Result<File> {
    as_reader(reader, || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(image)
    })
}

/// Whether this process may take `uid`'s file-system identity: `uid` is
/// mapped in its user namespace and `setgroups` is allowed there. Neither
/// holds in a namespace the user made (the unprivileged CLI), where the
/// kernel already checks as the user.
fn may_switch_to(uid: u32) -> bool {
    let denied = std::fs::read_to_string("/proc/self/setgroups").is_ok_and(|s| s.trim() == "deny");
    !denied
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| uid_is_mapped(&map, uid))
}

/// Whether a line `INSIDE OUTSIDE COUNT` of a uid map covers `uid`.
fn uid_is_mapped(map: &str, uid: u32) -> bool {
    map.lines().any(|line| {
        let n: Vec<u64> = line.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        matches!(n[..], [inside, _, count] if inside <= u64::from(uid) && u64::from(uid) < inside + count)
    })
}

/// Runs `f` (a file-system call) as `reader` would: this thread's
/// file-system uid, gid and groups become the user's for the call (raw
/// system calls, which change the calling thread only; the kernel drops
/// root's file capabilities with a non-zero fsuid), then root's come back.
/// Run as anyone but root, or for root, `f` runs as the caller. The kernel
/// then answers what it answers the user: a path in a folder the user
/// cannot search fails with "Permission denied" whether or not it exists.
pub(crate) fn as_reader<T>(
    reader: &UserIdentity,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    // SAFETY: geteuid never fails.
    if unsafe { libc::geteuid() } != 0 || reader.uid == 0 || !may_switch_to(reader.uid) {
        // Not root, or root of a namespace the user made (the unprivileged
        // CLI), where the kernel already checks as the user.
        return f();
    }
    crate::privilege::as_file_system_user(reader.uid, reader.gid, &reader.all_gids(), f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn switches_need_a_mapped_uid() {
        // The initial namespace maps every id; a namespace the user made
        // with remap-root maps only 0 (tests/suite/container_runtime.rs
        // `remap_root_shows_root_inside_and_the_user_outside`, unprivileged).
        assert!(uid_is_mapped("         0          0 4294967295\n", 1001));
        assert!(!uid_is_mapped("         0       1001          1\n", 1001));
        assert!(uid_is_mapped("      1001       1001          1\n", 1001));
        assert!(!uid_is_mapped("", 1001));
        assert!(
            may_switch_to(1001),
            "root of the initial namespace may switch"
        );
    }

    use super::*;

    fn root() -> UserIdentity {
        UserIdentity::lookup(0, 0).unwrap()
    }

    fn user(uid: u32, gid: u32) -> UserIdentity {
        UserIdentity {
            uid,
            gid,
            groups: vec![],
            name: "u".into(),
            home: String::new(),
            shell: String::new(),
            group_names: Default::default(),
        }
    }

    /// As root: the user's view decides, folders on the way included, and
    /// root keeps its own rights after.
    #[test]
    fn images_are_opened_with_the_users_rights() {
        use std::os::unix::fs::PermissionsExt;
        if crate::test_support::skip_unless_root("images_are_opened_with_the_users_rights") {
            return;
        }
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        let f = private.join("img");
        std::fs::write(&f, b"x").unwrap();
        let nobody = user(54321, 54321);
        let groups_before = crate::privilege::thread_groups().unwrap();
        mode(dir.path(), 0o755);
        mode(&private, 0o700);
        mode(&f, 0o644);
        let e = open_as(&f, &nobody).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        mode(&private, 0o755);
        assert!(open_as(&f, &nobody).is_ok());
        mode(&f, 0o600);
        assert!(open_as(&f, &nobody).is_err());
        let owner = user(54321, 54321);
        std::os::unix::fs::chown(&f, Some(54321), Some(1)).unwrap();
        assert!(open_as(&f, &owner).is_ok());
        mode(&f, 0o040);
        assert!(open_as(&f, &user(11111, 1)).is_ok(), "group read");
        assert!(open_as(&f, &nobody).is_err());
        // Root's rights are back in this thread.
        mode(&f, 0o000);
        assert!(File::open(&f).is_ok());
        assert_eq!(crate::privilege::thread_groups().unwrap(), groups_before);
    }

    #[test]
    fn a_device_or_an_unreadable_file_is_refused() {
        let e = LoopDevice::attach_read_only(Path::new("/dev/null"), &root()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("private.sqfs");
        std::fs::write(&f, b"hsqs").unwrap();
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let e = LoopDevice::attach_read_only(&f, &user(54321, 54321)).unwrap_err();
        assert!(e.to_string().contains("not readable by"), "{e}");
    }

    /// Reads `/sys/block/loopN/<attribute>`, trimmed; None when absent.
    fn sysfs(device: &Path, attribute: &str) -> Option<String> {
        let name = device.file_name()?.to_str()?;
        std::fs::read_to_string(format!("/sys/block/{name}/{attribute}"))
            .ok()
            .map(|text| text.trim().to_string())
    }

    fn backing_file() -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        file
    }

    fn assert_bound_then_cleared(device: LoopDevice, image: &Path) {
        let path = device.path().to_path_buf();
        assert_eq!(sysfs(&path, "ro").as_deref(), Some("1"));
        assert_eq!(sysfs(&path, "loop/autoclear").as_deref(), Some("1"));
        assert_eq!(
            sysfs(&path, "loop/backing_file").as_deref(),
            Some(image.to_str().unwrap())
        );
        drop(device);
        // Autoclear: the last close detaches it (possibly a moment later).
        let start = std::time::Instant::now();
        while sysfs(&path, "loop/backing_file").is_some() {
            assert!(
                start.elapsed().as_secs() < 10,
                "{} not cleared",
                path.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn attaches_read_only_with_autoclear() {
        if crate::test_support::skip_unless_root("attaches_read_only_with_autoclear") {
            return;
        }
        let image = backing_file();
        let device = LoopDevice::attach_read_only(image.path(), &root()).unwrap();
        assert_bound_then_cleared(device, image.path());
    }

    #[test]
    fn legacy_ioctls_attach_read_only_with_autoclear() {
        if crate::test_support::skip_unless_root("legacy_ioctls_attach_read_only_with_autoclear") {
            return;
        }
        let image = backing_file();
        let backing = File::open(image.path()).unwrap();
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")
            .unwrap();
        let info = loop_info(image.path());
        for _ in 0..MAX_ATTEMPTS {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns an index.
            let index = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            assert!(index >= 0);
            let path = PathBuf::from(format!("/dev/loop{index}"));
            let device = open_device(&path).unwrap();
            match configure_legacy(&device, &backing, &info) {
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => continue,
                other => other.unwrap(),
            }
            return assert_bound_then_cleared(LoopDevice { device, path }, image.path());
        }
        panic!("no free loop device");
    }

    #[test]
    fn missing_image_is_named() {
        let err = LoopDevice::attach_read_only(Path::new("/nonexistent/image.sqfs"), &root())
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/image.sqfs"),
            "{err:#}"
        );
    }
}
