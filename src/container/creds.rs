//! Switching the calling process to the container's user.

use std::io;

/// Sets supplementary groups, then real/effective/saved gid, then real/
/// effective/saved uid of the calling thread to the user's.
///
/// Raw syscalls only, no allocation: safe between fork and exec, also in the
/// child of a multi-threaded process (where the child has one thread).
pub(crate) fn become_user(uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: `groups` is a valid slice of gid_t for the length we pass.
    let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresgid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresgid, gid, gid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresuid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a process whose real uid is 0 fully root again (all uids and gids 0,
/// no supplementary groups), as slurmstepd is before it drops its effective
/// uid to the user's. Raw syscalls only: safe between fork and exec.
pub(crate) fn become_full_root() -> io::Result<()> {
    // SAFETY: setresuid takes three ids by value; uid first, so that we have
    // CAP_SETGID again for the calls below.
    if unsafe { libc::syscall(libc::SYS_setresuid, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresgid takes three ids by value.
    if unsafe { libc::syscall(libc::SYS_setresgid, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an empty group list; the pointer is not read for length 0.
    if unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
