//! Every identity switch of berth, in one place.
//!
//! slurmstepd calls `slurm_spank_user_init` with uid 0 and euid = the job's
//! user. The few steps that need root (pulling into the node store, mounting)
//! take it for their duration only ([`with_root`], [`RootGuard`]), and
//! helper processes started from there become full root (real, effective
//! and saved ids) or a given user before exec ([`run_as_full_root`],
//! [`run_as_user`]); a process switches itself with [`become_user`] and
//! [`become_full_root`]. A failed switch is an error (or, where going on
//! would mean acting as root for the user, the end of the process).

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Runs `f` with effective uid and gid 0, restoring the caller's effective ids after.
///
/// A no-op switch when the process already runs as root or when the real uid is
/// not root (the CLI of an ordinary user).
pub fn with_root<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: get*id never fail.
    let (ruid, euid, egid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getegid()) };
    if ruid != 0 || euid == 0 {
        return f();
    }
    // SAFETY: plain set*id calls; glibc applies them to every thread. When
    // one fails, `f` runs with fewer rights and fails on its own.
    unsafe {
        libc::seteuid(0);
        libc::setegid(0);
    }
    let result = f();
    // SAFETY: as above; restores the ids slurmstepd set for the user.
    let restored = unsafe { libc::setegid(egid) == 0 && libc::seteuid(euid) == 0 };
    if !restored {
        // Going on as root on the user's behalf is never an option.
        eprintln!(
            "berth: cannot give up root again (seteuid {euid}): {}",
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
    result
}

/// Makes the child of `command` full root before it execs, when its real uid
/// is root; a failed switch fails the spawn (nothing is executed).
pub fn run_as_full_root(command: &mut Command) {
    // SAFETY: the closure only makes raw set*id system calls, which are
    // async-signal-safe and fine in the child of a multi-threaded parent.
    unsafe {
        command.pre_exec(|| {
            if libc::syscall(libc::SYS_getuid) != 0 {
                return Ok(());
            }
            let zero: libc::gid_t = 0;
            if libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setresgid, 0, 0, 0) != 0
                || libc::syscall(libc::SYS_setgroups, 1, &zero as *const libc::gid_t) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the child of `command` the user `uid`/`gid` with exactly the
/// supplementary `groups` (none when empty) before it execs: real,
/// effective and saved ids, `no_new_privs`, umask 022. Works from
/// slurmstepd's `user_init` (real uid 0, effective uid the job's user) and
/// from a root process.
pub fn run_as_user(command: &mut Command, uid: u32, gid: u32, groups: Vec<u32>) {
    switch_user(command, uid, gid, groups, true);
}

/// Like [`run_as_user`] but without `no_new_privs`: for a program of the
/// user's own that, as in any of their job's tasks, may exec the node's
/// set-user-id helpers (rootless podman maps the user's subordinate ids
/// with `newuidmap`/`newgidmap`). Gives the child nothing the user's own
/// tasks do not have.
pub fn run_as_user_with_setuid_helpers(
    command: &mut Command,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
) {
    switch_user(command, uid, gid, groups, false);
}

/// [`run_as_user`], with or without `no_new_privs`.
fn switch_user(command: &mut Command, uid: u32, gid: u32, groups: Vec<u32>, no_new_privs: bool) {
    // SAFETY: the closure makes raw system calls only (async-signal-safe, no
    // allocation: `groups` was allocated before the fork); in the child of a
    // fork there is one thread, so per-thread set*id is the whole process.
    unsafe {
        command.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if libc::syscall(libc::SYS_getuid) == 0
                && libc::syscall(libc::SYS_setresuid, 0, 0, 0) != 0
            {
                return fail();
            }
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return fail();
            }
            // Refuse to go on as anyone else (a failed switch must not exec).
            if libc::syscall(libc::SYS_geteuid) != uid as libc::c_long
                || libc::syscall(libc::SYS_getegid) != gid as libc::c_long
            {
                return Err(std::io::Error::from_raw_os_error(libc::EPERM));
            }
            if no_new_privs && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
            libc::umask(0o022);
            Ok(())
        });
    }
}

/// Effective root while alive, for a process whose real uid is 0 and whose
/// effective uid is not (slurmstepd in `user_init`); nothing otherwise.
/// Raising fails with an error; when the caller's effective ids cannot be
/// restored the process ends, as going on as root on the user's behalf is
/// never an option.
pub struct RootGuard {
    /// The effective uid and gid to restore.
    restore: Option<(libc::uid_t, libc::gid_t)>,
}

impl RootGuard {
    /// Takes effective root when the real uid is root and the effective one
    /// is not.
    pub fn take() -> std::io::Result<RootGuard> {
        // SAFETY: get*id never fail.
        let (ruid, euid, egid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getegid()) };
        if ruid != 0 || euid == 0 {
            return Ok(RootGuard { restore: None });
        }
        // SAFETY: plain set*id calls; glibc applies them to every thread.
        if unsafe { libc::seteuid(0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let guard = RootGuard {
            restore: Some((euid, egid)),
        };
        // SAFETY: as above (the guard gives the uid back if this fails).
        if unsafe { libc::setegid(0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(guard)
    }
}

impl Drop for RootGuard {
    fn drop(&mut self) {
        let Some((euid, egid)) = self.restore else {
            return;
        };
        // SAFETY: plain set*id calls; gid first, while still root.
        let restored = unsafe { libc::setegid(egid) == 0 && libc::seteuid(euid) == 0 };
        if !restored {
            eprintln!(
                "berth: cannot give up root again (seteuid {euid}): {}",
                std::io::Error::last_os_error()
            );
            std::process::abort();
        }
    }
}

/// Sets supplementary groups, then real/effective/saved gid, then real/
/// effective/saved uid of the calling thread to the user's.
///
/// Raw syscalls only, no allocation: safe between fork and exec, also in the
/// child of a multi-threaded process (where the child has one thread).
pub fn become_user(uid: u32, gid: u32, groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: `groups` is a valid slice of gid_t for the length we pass.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: setresgid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: setresuid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a process whose real uid is 0 fully root again (all uids and gids 0,
/// no supplementary groups), as slurmstepd is before it drops its effective
/// uid to the user's. Raw syscalls only: safe between fork and exec.
pub fn become_full_root() -> std::io::Result<()> {
    // SAFETY: setresuid takes three ids by value; uid first, so that we have
    // CAP_SETGID again for the calls below.
    if unsafe { libc::syscall(libc::SYS_setresuid, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: setresgid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresgid, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: an empty group list; the pointer is not read for length 0.
    if unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops `CAP_SETGID` from the calling (child) process: setgroups fails then.
    fn drop_setgid_capability() -> std::io::Result<()> {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: capget/capset with a version-3 header and two data slots,
        // as capget(2) defines them.
        unsafe {
            if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // CAP_SETGID is capability number 6 (linux/capability.h).
            let setgid = 1u32 << 6;
            data[0].effective &= !setgid;
            data[0].permitted &= !setgid;
            if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Needs root: in a child with real uid 0 and effective uid 65534 (as
    /// slurmstepd in `user_init`), the guard gives effective root and its
    /// drop gives the user's ids back.
    #[test]
    fn the_root_guard_raises_and_restores() {
        if !nix::unistd::geteuid().is_root() {
            assert!(RootGuard::take().unwrap().restore.is_none());
            return;
        }
        // SAFETY: the child makes raw set*id/get*id calls only (the guard
        // allocates nothing on these paths) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above.
            let code = unsafe {
                if libc::setegid(65534) != 0 || libc::seteuid(65534) != 0 {
                    libc::_exit(2);
                }
                match RootGuard::take() {
                    Ok(guard) => {
                        let raised = libc::geteuid() == 0 && libc::getegid() == 0;
                        drop(guard);
                        let back = libc::geteuid() == 65534 && libc::getegid() == 65534;
                        if raised && back {
                            0
                        } else {
                            3
                        }
                    }
                    Err(_) => 4,
                }
            };
            // SAFETY: ends the forked child without running the parent's handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status}");
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }

    /// Needs root (else only the unprivileged half runs): a child whose
    /// switch to full root or to the user fails is not run.
    #[test]
    fn a_failed_switch_runs_nothing() {
        if !nix::unistd::geteuid().is_root() {
            let mut command = Command::new("true");
            run_as_user(&mut command, 0, 0, Vec::new());
            assert!(command.status().is_err(), "became root without rights");
            return;
        }
        let mut command = Command::new("id");
        run_as_full_root(&mut command);
        let out = command.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "uid=0(root) gid=0(root) groups=0(root)"
        );
        for full_root in [true, false] {
            let mut command = Command::new("true");
            // SAFETY: raw capget/capset calls only, async-signal-safe after fork.
            unsafe { command.pre_exec(drop_setgid_capability) };
            if full_root {
                run_as_full_root(&mut command);
            } else {
                run_as_user(&mut command, 65534, 65534, Vec::new());
            }
            let e = command.status().unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        }
    }
}
