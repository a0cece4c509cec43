//! The caller's side of the holder: start it, answer it, take its namespaces.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::unistd::{geteuid, getuid};

use crate::container::channel::{Channel, FromHolder, ToHolder};
use crate::container::fuse::Daemon;
use crate::container::holder::{HOLDER_ARG, HOLDER_FD};
use crate::container::join::Container;
use crate::container::spec::{ContainerSpec, Mode, Namespace, UserIdentity};

/// How long the caller waits for any one answer of the holder.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the container described by `spec` with a helper process
/// (`<helper_exe> __holder`, see [`crate::container::holder_main`]) and returns
/// its namespaces.
///
/// [`Mode::Privileged`] needs real uid 0; when only the effective uid was
/// dropped (slurmstepd in `slurm_spank_user_init`), it is raised to 0 for the
/// duration of the call and restored, and the helper runs as full root.
/// [`Mode::Unprivileged`] runs as `spec.user`, which must be the caller.
///
/// Safe to call from a multi-threaded process: the helper is started with
/// fork and exec, and only raw syscalls run in between.
pub fn spawn_holder(
    helper_exe: &Path,
    spec: &ContainerSpec,
    mode: Mode,
) -> anyhow::Result<Container> {
    check_caller(spec, mode)?;
    // slurmstepd in user_init: root for the spawn and the id maps.
    let _root = match mode {
        Mode::Privileged => Some(
            crate::privilege::RootGuard::take().context("cannot raise the effective uid to 0")?,
        ),
        Mode::Unprivileged => None,
    };
    let (ours, theirs) =
        UnixStream::pair().context("cannot create the socket pair for the container helper")?;
    let mut command = Command::new(helper_exe);
    command
        .arg(HOLDER_ARG)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let channel_fd = theirs.as_raw_fd();
    let full_root = mode == Mode::Privileged;
    // SAFETY: the closure makes raw syscalls only (dup2, fcntl, setres*id,
    // setgroups): async-signal-safe, as required after fork in a
    // multi-threaded process.
    unsafe {
        command.pre_exec(move || {
            hand_over_channel(channel_fd)?;
            if full_root && libc::getuid() == 0 {
                crate::privilege::become_full_root()?;
            }
            Ok(())
        });
    }
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot start the container helper {} {HOLDER_ARG}",
            helper_exe.display()
        )
    })?;
    drop(theirs);
    let mut container_ns = None;
    let result = Channel::new(ours)
        .and_then(|mut channel| drive(&mut channel, &child, spec, mode, &mut container_ns));
    let finished = finish_child(&mut child, result.is_ok());
    if result.is_err() {
        if let Some(ns) = &container_ns {
            // The holder died or failed half-way: what it started inside
            // (the image ENTRYPOINT and its children) must not keep the
            // half-built container, its mounts and loop device alive.
            kill_namespace_members(ns);
        }
    }
    finished.and(result).with_context(|| {
        format!(
            "cannot set up the container for image {}",
            spec.squashfs.display()
        )
    })
}

/// Runs the protocol: Start, maps, Ready; opens the namespaces; Release.
/// `container_ns` gets the container's mount namespace as soon as the holder
/// made it (for cleaning up after a failure).
fn drive(
    channel: &mut Channel,
    child: &Child,
    spec: &ContainerSpec,
    mode: Mode,
    container_ns: &mut Option<OwnedFd>,
) -> anyhow::Result<Container> {
    channel.set_timeout(STEP_TIMEOUT)?;
    let mut spec_for_holder = spec.clone();
    if spec.squashfs.is_relative() {
        // The holder's helpers (squashfuse) do not run in our directory.
        let cwd = std::env::current_dir().context("cannot find the current directory")?;
        spec_for_holder.squashfs = cwd.join(&spec.squashfs);
    }
    channel.send(&ToHolder::Start {
        spec: Box::new(spec_for_holder),
        mode,
    })?;
    let pid = child.id() as i32;
    loop {
        match channel.recv::<FromHolder>()? {
            FromHolder::NeedMaps { .. } => {
                // The mount namespace the container lives in from here on.
                *container_ns = open_namespace(pid, "mnt").ok();
                write_id_maps(pid, &spec.user, mode, spec.remap_root)?;
                channel.send(&ToHolder::MapsWritten)?;
            }
            FromHolder::Ready {
                fuse_pids,
                entrypoint,
                warnings,
                mount_table,
                hook_env,
                ..
            } => {
                let user_ns = open_namespace(pid, "user")?;
                let mount_ns = open_namespace(pid, "mnt")?;
                let namespaces = own_namespaces(spec)
                    .into_iter()
                    .map(|kind| Ok((kind, open_namespace(pid, kind.name())?)))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let daemons = fuse_pids
                    .into_iter()
                    .map(|fuse_pid| {
                        Daemon::open(fuse_pid).with_context(|| {
                            format!("cannot take hold of FUSE daemon (pid {fuse_pid})")
                        })
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let mut container = Container::new(user_ns, mount_ns, namespaces, spec, daemons);
                container.set_entrypoint_outcome(entrypoint);
                container.set_warnings(warnings);
                container.set_mount_table(mount_table);
                container.add_env(hook_env);
                channel.send(&ToHolder::Release)?;
                return Ok(container);
            }
            FromHolder::Failed { error } => bail!("{error}"),
        }
    }
}

/// The namespaces besides user and mount that the container has of its own,
/// in the order a task joins them.
fn own_namespaces(spec: &ContainerSpec) -> Vec<Namespace> {
    let mut kinds = spec.unshare.clone();
    if spec.has_own_uts() {
        kinds.push(Namespace::Uts);
    }
    kinds.sort();
    kinds.dedup();
    kinds
}

/// Reaps the helper. After a failure it is killed first (it may be stuck);
/// after success it must exit 0 by itself.
fn finish_child(child: &mut Child, succeeded: bool) -> anyhow::Result<()> {
    if !succeeded {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(());
    }
    let status = child
        .wait()
        .context("cannot wait for the container helper")?;
    if !status.success() {
        bail!("the container helper exited with {status} after setup");
    }
    Ok(())
}

/// SIGKILLs every process in the mount namespace `ns` (held open by the
/// caller, so its inode names no other namespace), until none is left or a
/// second has passed.
fn kill_namespace_members(ns: &OwnedFd) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = File::from(match ns.try_clone() {
        Ok(fd) => fd,
        Err(_) => return,
    })
    .metadata() else {
        return;
    };
    let link = format!("mnt:[{}]", meta.ino());
    for _ in 0..50 {
        let mut found = false;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let in_ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .is_ok_and(|target| target.as_os_str() == link.as_str());
            if in_ns {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn check_caller(spec: &ContainerSpec, mode: Mode) -> anyhow::Result<()> {
    match mode {
        Mode::Privileged if !getuid().is_root() && !geteuid().is_root() => bail!(
            "setting up a container for another user needs root; run as root, or in \
             unprivileged mode as the user"
        ),
        Mode::Unprivileged if geteuid().as_raw() != spec.user.uid => bail!(
            "an unprivileged container runs as its caller (uid {}), not as {} (uid {})",
            geteuid(),
            spec.user.name,
            spec.user.uid
        ),
        _ => Ok(()),
    }
}

/// Puts the child's end of the socket pair on [`HOLDER_FD`], inheritable.
/// Runs between fork and exec.
fn hand_over_channel(fd: RawFd) -> std::io::Result<()> {
    let ret = if fd == HOLDER_FD {
        // SAFETY: fcntl on a descriptor we own; clears FD_CLOEXEC.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }
    } else {
        // SAFETY: dup2 onto a fixed number; the copy does not have FD_CLOEXEC.
        unsafe { libc::dup2(fd, HOLDER_FD) }
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The uid_map, setgroups and gid_map contents for the holder's user namespace.
///
/// Privileged: the uid, and the primary and every supplementary group, each
/// mapped to itself, one line each; never a range, and never 0 unless the
/// user is root (a user who became uid 0 inside must not own host root's
/// files). Unprivileged: the kernel allows only the caller's own uid and gid.
///
/// `setgroups` is denied in both: the groups the holder took before
/// `unshare` stay, and no process of the user that joins the namespace
/// (where it has every capability) can drop one to get past a mode or ACL
/// that shuts that group out.
///
/// With `remap_root`, uid 0 and gid 0 inside are the user's uid and primary
/// gid (never host root's unless the user is root); the other groups keep
/// their ids.
pub(crate) fn id_maps(
    user: &UserIdentity,
    mode: Mode,
    remap_root: bool,
) -> (String, &'static str, String) {
    let inside = |id: u32, primary: u32| if remap_root && id == primary { 0 } else { id };
    let uid_map = format!("{} {} 1\n", inside(user.uid, user.uid), user.uid);
    match mode {
        Mode::Privileged => {
            let gid_map = user
                .all_gids()
                .into_iter()
                .filter(|gid| *gid != 0 || user.uid == 0)
                .map(|gid| format!("{} {gid} 1\n", inside(gid, user.gid)))
                .collect();
            (uid_map, "deny", gid_map)
        }
        Mode::Unprivileged => {
            let gid_map = format!("{} {} 1\n", inside(user.gid, user.gid), user.gid);
            (uid_map, "deny", gid_map)
        }
    }
}

fn write_id_maps(
    pid: i32,
    user: &UserIdentity,
    mode: Mode,
    remap_root: bool,
) -> anyhow::Result<()> {
    let (uid_map, setgroups, gid_map) = id_maps(user, mode, remap_root);
    for (file, content) in [
        ("uid_map", uid_map.as_str()),
        ("setgroups", setgroups),
        ("gid_map", gid_map.as_str()),
    ] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, content).with_context(|| {
            format!(
                "cannot write {path} ({:?}) for the container's user namespace",
                content.trim_end()
            )
        })?;
    }
    Ok(())
}

fn open_namespace(pid: i32, kind: &str) -> anyhow::Result<OwnedFd> {
    let path = format!("/proc/{pid}/ns/{kind}");
    let file = File::open(&path).with_context(|| format!("cannot open {path}"))?;
    Ok(file.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn user(uid: u32, gid: u32, groups: Vec<u32>) -> UserIdentity {
        UserIdentity {
            uid,
            gid,
            groups,
            name: "u".into(),
            home: "/".into(),
            shell: "/bin/sh".into(),
            group_names: BTreeMap::new(),
        }
    }

    #[test]
    fn privileged_maps_each_group_to_itself() {
        let (uid_map, setgroups, gid_map) = id_maps(
            &user(1001, 1002, vec![1002, 1001, 27]),
            Mode::Privileged,
            false,
        );
        assert_eq!(uid_map, "1001 1001 1\n");
        assert_eq!(setgroups, "deny");
        assert_eq!(gid_map, "1002 1002 1\n1001 1001 1\n27 27 1\n");
    }

    #[test]
    fn privileged_never_maps_group_zero_for_a_user() {
        let (_, _, gid_map) = id_maps(&user(1001, 1002, vec![0, 1002]), Mode::Privileged, false);
        assert_eq!(gid_map, "1002 1002 1\n");
    }

    #[test]
    fn root_maps_itself() {
        let (uid_map, _, gid_map) = id_maps(&user(0, 0, vec![0]), Mode::Privileged, false);
        assert_eq!(uid_map, "0 0 1\n");
        assert_eq!(gid_map, "0 0 1\n");
    }

    #[test]
    fn remap_root_maps_inside_zero_to_the_user() {
        let (uid_map, setgroups, gid_map) =
            id_maps(&user(1001, 1002, vec![1002, 27]), Mode::Privileged, true);
        assert_eq!(uid_map, "0 1001 1\n");
        assert_eq!(setgroups, "deny");
        assert_eq!(gid_map, "0 1002 1\n27 27 1\n");
        let (uid_map, setgroups, gid_map) =
            id_maps(&user(1001, 1002, vec![1002]), Mode::Unprivileged, true);
        assert_eq!(uid_map, "0 1001 1\n");
        assert_eq!(setgroups, "deny");
        assert_eq!(gid_map, "0 1002 1\n");
    }

    #[test]
    fn remap_root_never_maps_host_root_group_for_a_user() {
        let (_, _, gid_map) = id_maps(&user(1001, 1002, vec![0, 1002]), Mode::Privileged, true);
        assert_eq!(gid_map, "0 1002 1\n");
    }

    #[test]
    fn own_namespaces_are_sorted_and_unique() {
        let mut spec = ContainerSpec::new(
            "/i.sqfs".into(),
            Default::default(),
            user(1001, 1001, vec![1001]),
        );
        assert!(own_namespaces(&spec).is_empty());
        spec.unshare = vec![Namespace::Uts, Namespace::Net];
        spec.hostname = Some("h".into());
        assert_eq!(own_namespaces(&spec), vec![Namespace::Net, Namespace::Uts]);
    }

    #[test]
    fn unprivileged_maps_only_self() {
        let (uid_map, setgroups, gid_map) = id_maps(
            &user(1001, 1002, vec![1002, 1001]),
            Mode::Unprivileged,
            false,
        );
        assert_eq!(uid_map, "1001 1001 1\n");
        assert_eq!(setgroups, "deny");
        assert_eq!(gid_map, "1002 1002 1\n");
    }
}
