//! A new IPC namespace brings new System V objects and a new POSIX message
//! queue instance, but `/dev/shm` (POSIX shared memory) and `/dev/mqueue`
//! are still the node's mounts: give the container its own.

use std::path::Path;

use anyhow::Context;
use nix::mount::{mount, MsFlags};

/// Where POSIX shared memory objects live (`shm_open`).
const SHM_DIR: &str = "/dev/shm";

/// Where the message queue file system is mounted by convention (`mq_open`
/// does not need it; `ls /dev/mqueue` does).
const MQUEUE_DIR: &str = "/dev/mqueue";

/// In the container's root (after pivot_root), inside its new IPC namespace:
/// a fresh tmpfs on `/dev/shm` (mode 1777, `nosuid,nodev`) and a new mqueue
/// mount of this namespace on `/dev/mqueue`; each only where the folder
/// exists. Needs CAP_SYS_ADMIN in the user namespace that owns the IPC
/// namespace (the holder's own).
pub(crate) fn mount_own_ipc_files() -> anyhow::Result<()> {
    if Path::new(SHM_DIR).is_dir() {
        mount(
            Some("tmpfs"),
            SHM_DIR,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        )
        .with_context(|| {
            format!("--container-unshare=ipc: cannot mount a new tmpfs on {SHM_DIR}")
        })?;
    }
    if Path::new(MQUEUE_DIR).is_dir() {
        mount(
            Some("mqueue"),
            MQUEUE_DIR,
            Some("mqueue"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .with_context(|| {
            format!(
                "--container-unshare=ipc: cannot mount the new IPC namespace's message queues on \
                 {MQUEUE_DIR}"
            )
        })?;
    }
    Ok(())
}
