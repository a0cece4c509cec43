//! Switching between the job's user and root inside slurmstepd.
//!
//! slurmstepd calls `slurm_spank_user_init` with uid 0 and euid = the job's
//! user. The few steps that need root (pulling into the node store, mounting)
//! take it for their duration only, and helper processes started from there
//! become full root (real, effective and saved ids) before exec.

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
    // SAFETY: plain set*id calls; glibc applies them to every thread.
    unsafe {
        libc::seteuid(0);
        libc::setegid(0);
    }
    let result = f();
    // SAFETY: as above; restores the ids slurmstepd set for the user.
    unsafe {
        libc::setegid(egid);
        libc::seteuid(euid);
    }
    result
}

/// Makes the child of `command` full root before it execs, when its real uid is root.
pub fn run_as_full_root(command: &mut Command) {
    // SAFETY: the closure only makes raw set*id system calls, which are
    // async-signal-safe and fine in the child of a multi-threaded parent.
    unsafe {
        command.pre_exec(|| {
            if libc::syscall(libc::SYS_getuid) == 0 {
                let zero: libc::gid_t = 0;
                libc::syscall(libc::SYS_setresuid, 0, 0, 0);
                libc::syscall(libc::SYS_setresgid, 0, 0, 0);
                libc::syscall(libc::SYS_setgroups, 1, &zero as *const libc::gid_t);
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
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
            libc::umask(0o022);
            Ok(())
        });
    }
}
