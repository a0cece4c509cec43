//! FUSE daemons for unprivileged containers: `squashfuse` serves the image,
//! `fuse-overlayfs` the writable root on top of it.
//!
//! The holder starts them inside its user namespace with `CAP_SYS_ADMIN` (of
//! that namespace only) as an ambient capability, so they can mount directly;
//! they live in the container's mount namespace and keep it alive, so the
//! caller stops them (through pidfds, see [`Daemon`]) once it is done with the
//! container.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::container::mounts::StagingPaths;

/// How long a daemon may take to mount.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// A running FUSE daemon, stopped when dropped unless [`FuseMount::keep`] is called.
#[derive(Debug)]
pub(crate) struct FuseMount {
    child: Option<Child>,
}

impl FuseMount {
    /// The daemon's process id.
    pub(crate) fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |child| child.id() as i32)
    }

    /// Leaves the daemon running (it outlives the holder; the caller stops it
    /// and init reaps it) and returns its pid.
    #[allow(clippy::zombie_processes)] // Not ours to wait for: see above.
    pub(crate) fn keep(mut self) -> i32 {
        let child = self
            .child
            .take()
            .expect("a FuseMount always holds its child");
        child.id() as i32
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Mounts `image` read-only on `mountpoint` with `squashfuse`.
pub(crate) fn mount_squashfuse(image: &Path, mountpoint: &Path) -> anyhow::Result<FuseMount> {
    let mut command = Command::new("squashfuse");
    command.arg("-f").arg(image).arg(mountpoint);
    start(command, "squashfuse", mountpoint)
        .with_context(|| format!("cannot mount image {} with squashfuse", image.display()))
}

/// Mounts a writable overlay of `paths.lower` on `paths.root` with
/// `fuse-overlayfs`, every file shown as owned by `uid`:`gid` (the image's
/// root-owned files could not be written, or copied up, by the user otherwise).
pub(crate) fn mount_fuse_overlayfs(
    paths: &StagingPaths,
    uid: u32,
    gid: u32,
) -> anyhow::Result<FuseMount> {
    for dir in [&paths.lower, &paths.upper, &paths.work] {
        if dir.to_string_lossy().contains([',', ':', '\\']) {
            bail!(
                "cannot use {} as an overlay layer: its path contains ',', ':' or '\\'",
                dir.display()
            );
        }
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={},squash_to_uid={uid},squash_to_gid={gid}",
        paths.lower.display(),
        paths.upper.display(),
        paths.work.display()
    );
    let mut command = Command::new("fuse-overlayfs");
    command.arg("-f").arg("-o").arg(&options).arg(&paths.root);
    start(command, "fuse-overlayfs", &paths.root)
        .with_context(|| format!("cannot mount the container root with fuse-overlayfs ({options})"))
}

fn start(mut command: Command, program: &str, mountpoint: &Path) -> anyhow::Result<FuseMount> {
    let unmounted_dev = std::fs::metadata(mountpoint)
        .with_context(|| format!("cannot stat mount point {}", mountpoint.display()))?
        .dev();
    command
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: the closure only makes raw syscalls (no allocation, no locks).
    unsafe {
        command.pre_exec(raise_ambient_sys_admin);
    }
    let child = command.spawn().with_context(|| {
        format!("cannot start {program}: is it installed (package '{program}')?")
    })?;
    let mut mount = FuseMount { child: Some(child) };
    let started = Instant::now();
    loop {
        let child = mount
            .child
            .as_mut()
            .expect("a FuseMount always holds its child");
        if let Some(status) = child
            .try_wait()
            .context("cannot wait for the FUSE daemon")?
        {
            mount.child = None;
            bail!(
                "{program} exited ({status}) before mounting {} (its own message, if any, \
                 is above); if it could not open /dev/fuse, make it usable by users: \
                 chmod 0666 /dev/fuse",
                mountpoint.display()
            );
        }
        if let Ok(meta) = std::fs::metadata(mountpoint) {
            if meta.dev() != unmounted_dev {
                return Ok(mount);
            }
        }
        if started.elapsed() > MOUNT_TIMEOUT {
            bail!(
                "{program} did not mount {} within {} s",
                mountpoint.display(),
                MOUNT_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Makes CAP_SYS_ADMIN (of our user namespace) ambient, so the daemon keeps it
/// across exec and may call mount(2). Runs between fork and exec.
fn raise_ambient_sys_admin() -> io::Result<()> {
    use crate::privilege::{capget, capset, CAP_SYS_ADMIN};
    let mut data = capget()?;
    data[0].inheritable |= 1 << CAP_SYS_ADMIN;
    capset(&data)?;
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            CAP_SYS_ADMIN as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A FUSE daemon serving a container, held by the caller through a pidfd (so a
/// recycled pid is never signalled).
#[derive(Debug)]
pub(crate) struct Daemon {
    pid: i32,
    pidfd: OwnedFd,
}

impl Daemon {
    /// Takes hold of the daemon with process id `pid` (the holder's child; the
    /// holder must still be alive so the pid cannot have been recycled).
    pub(crate) fn open(pid: i32) -> io::Result<Daemon> {
        // SAFETY: pidfd_open takes a pid and flags by value.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Daemon { pid, pidfd })
    }

    /// The daemon's process id.
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    fn signal(&self, signal: i32) {
        // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo, no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// Waits up to `timeout` for the daemon to exit; true when it did.
    fn wait_exit(&self, timeout: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, millis) > 0 }
    }
}

/// Stops the daemons in order: SIGTERM to all, then SIGKILL to those still
/// running after a short grace period.
pub(crate) fn stop_all(daemons: &[Daemon]) {
    for daemon in daemons {
        daemon.signal(libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for daemon in daemons {
        let left = deadline.saturating_duration_since(Instant::now());
        if !daemon.wait_exit(left) {
            daemon.signal(libc::SIGKILL);
            daemon.wait_exit(STOP_TIMEOUT);
        }
    }
}
