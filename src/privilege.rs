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
/// not root (the CLI of an ordinary user). Built on [`RootGuard`]: when root
/// cannot be taken, `f` runs with the caller's ids (and fails on its own);
/// when the caller's ids cannot be restored the process ends.
pub fn with_root<T>(f: impl FnOnce() -> T) -> T {
    let guard = match RootGuard::take() {
        Ok(guard) => Some(guard),
        Err(err) => {
            eprintln!("berth: cannot take effective root, going on as the caller: {err}");
            None
        }
    };
    let result = f();
    drop(guard);
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
            if no_new_privs {
                become_user(uid, gid, &groups)?;
            } else {
                switch_ids(uid, gid, &groups)?;
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

/// Makes the calling thread the user for good: supplementary groups, then
/// real/effective/saved gid, then real/effective/saved uid, each call checked
/// and the result read back, then `no_new_privs` (no set-id program or file
/// capability gives anything back). Starts from full root when the real uid
/// is 0, so it works from slurmstepd's `user_init` (effective uid the
/// user's) as from a root process.
///
/// The one way berth becomes a user: helpers' children ([`run_as_user`]),
/// the holder, ldconfig of library injection, commands joining a container.
/// Raw syscalls only, no allocation: safe between fork and exec, also in the
/// child of a multi-threaded process (where the child has one thread).
pub fn become_user(uid: u32, gid: u32, groups: &[libc::gid_t]) -> std::io::Result<()> {
    switch_ids(uid, gid, groups)?;
    // SAFETY: prctl with integer arguments only; async-signal-safe.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`become_user`] for a process that creates a user namespace next (the
/// holder): the same switch, but `CAP_SYS_ADMIN` (and no other capability)
/// stays permitted and effective. Kernels that restrict unprivileged user
/// namespaces (Debian's `kernel.unprivileged_userns_clone=0`, Ubuntu's
/// `kernel.apparmor_restrict_unprivileged_userns=1`) let a process with it
/// create one, and the namespace is still the user's (its owner is the
/// effective uid), so the step's tasks can enter it. Once the process is in
/// its new user namespace the capability means nothing outside it; the
/// user cannot trace or signal the process meanwhile (it holds a
/// capability the user lacks, and `no_new_privs` is set). Raw syscalls
/// only, no allocation.
pub fn become_user_for_a_user_namespace(
    uid: u32,
    gid: u32,
    groups: &[libc::gid_t],
) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let switched = switch_ids(uid, gid, groups);
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) };
    switched?;
    let admin = CapData {
        effective: 1 << CAP_SYS_ADMIN,
        permitted: 1 << CAP_SYS_ADMIN,
        inheritable: 0,
    };
    capset(&[admin, CapData::default()])?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The header of `capget(2)`/`capset(2)`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// One 32-bit half of a process's capability sets (version 3 has two:
/// capabilities 0 to 31, then 32 to 63).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct CapData {
    /// The effective set.
    pub(crate) effective: u32,
    /// The permitted set.
    pub(crate) permitted: u32,
    /// The inheritable set.
    pub(crate) inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// `CAP_SYS_ADMIN`, capability number 21 (linux/capability.h).
pub(crate) const CAP_SYS_ADMIN: u32 = 21;

/// The calling thread's capability sets (no allocation: safe between fork
/// and exec).
pub(crate) fn capget() -> std::io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: a version-3 header and two data slots, as capget(2) defines them.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(data)
}

/// Sets the calling thread's capability sets (no allocation).
pub(crate) fn capset(data: &[CapData; 2]) -> std::io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: a version-3 header and two data slots, as capset(2) defines them.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`become_user`] without `no_new_privs`, for [`run_as_user_with_setuid_helpers`] only.
fn switch_ids(uid: u32, gid: u32, groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: getuid never fails; setresuid takes three ids by value (from
    // real uid 0 it is allowed and gives back CAP_SETGID for setgroups).
    if unsafe { libc::syscall(libc::SYS_getuid) } == 0
        && unsafe { libc::syscall(libc::SYS_setresuid, 0, 0, 0) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
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
    // Refuse to go on as anyone else (a switch that did not take must not
    // run anything): read all six ids back.
    let (mut r, mut e, mut s) = (0, 0, 0);
    let (mut rg, mut eg, mut sg) = (0, 0, 0);
    // SAFETY: getresuid/getresgid write one id to each of three valid pointers.
    let read = unsafe {
        libc::syscall(libc::SYS_getresuid, &mut r, &mut e, &mut s) == 0
            && libc::syscall(libc::SYS_getresgid, &mut rg, &mut eg, &mut sg) == 0
    };
    if !read || [r, e, s] != [uid; 3] || [rg, eg, sg] != [gid; 3] {
        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Runs `f` with the effective uid, gid and groups of a user, then takes root
/// back (a root process whose saved uid stays 0, such as the save helper).
/// glibc applies the switch to every thread. Every call is checked: when the
/// switch fails `f` does not run; when root cannot be taken back the error
/// says so, whatever `f` returned.
pub fn as_effective_user<T>(
    uid: u32,
    gid: u32,
    groups: &[libc::gid_t],
    f: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    // SAFETY: plain set*id calls; the group list pointer and length describe `groups`.
    let switched = unsafe {
        libc::setgroups(groups.len(), groups.as_ptr()) == 0
            && libc::setegid(gid) == 0
            && libc::seteuid(uid) == 0
    };
    let result = if switched {
        f()
    } else {
        Err(std::io::Error::last_os_error())
    };
    // SAFETY: as above; uid first, as the saved uid 0 allows it and gives
    // back CAP_SETGID for the other two.
    let restored = unsafe {
        libc::seteuid(0) == 0 && libc::setegid(0) == 0 && libc::setgroups(0, std::ptr::null()) == 0
    };
    if !restored {
        let err = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            err.kind(),
            format!("cannot take root back after acting as uid {uid}: {err}"),
        ));
    }
    result
}

/// Runs `f` (a file-system call) with this thread's file-system uid, gid and
/// groups set to a user's (raw system calls, which change the calling thread
/// only; the kernel drops root's file capabilities with a non-zero fsuid),
/// then puts the thread's back. Every switch is checked: when it does not
/// take `f` does not run; when the thread's ids cannot be put back the
/// process ends, as the thread would go on with the wrong identity.
pub fn as_file_system_user<T>(
    uid: u32,
    gid: u32,
    groups: &[libc::gid_t],
    f: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let saved_groups = thread_groups()?;
    // SAFETY: setgroups reads `groups.len()` gids from a live slice.
    if unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take an id and return the previous one.
    let (old_gid, old_uid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsgid, gid),
            libc::syscall(libc::SYS_setfsuid, uid),
        )
    };
    // setfs*id report no error: ask (-1 changes nothing) whether they took.
    let took = fs_ids() == (i64::from(uid), i64::from(gid));
    let result = if took {
        f()
    } else {
        Err(std::io::Error::other(
            "cannot take the user's file-system identity",
        ))
    };
    // SAFETY: restores what was saved above, in the same thread.
    let groups_back = unsafe {
        libc::syscall(libc::SYS_setfsuid, old_uid);
        libc::syscall(libc::SYS_setfsgid, old_gid);
        libc::syscall(
            libc::SYS_setgroups,
            saved_groups.len(),
            saved_groups.as_ptr(),
        ) == 0
    };
    if !groups_back || fs_ids() != (old_uid, old_gid) {
        eprintln!(
            "berth: cannot take this thread's own identity back after acting as uid {uid}: {}",
            std::io::Error::last_os_error()
        );
        std::process::abort();
    }
    result
}

/// This thread's file-system uid and gid.
fn fs_ids() -> (i64, i64) {
    // SAFETY: setfsuid/setfsgid with -1 change nothing and return the current id.
    unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, u32::MAX),
            libc::syscall(libc::SYS_setfsgid, u32::MAX),
        )
    }
}

/// The calling thread's supplementary groups.
pub fn thread_groups() -> std::io::Result<Vec<libc::gid_t>> {
    // SAFETY: with size 0 getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut groups = vec![0; n as usize];
    // SAFETY: the vector has room for `n` gids.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
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
        let mut data = capget()?;
        // CAP_SETGID is capability number 6 (linux/capability.h).
        let setgid = 1u32 << 6;
        data[0].effective &= !setgid;
        data[0].permitted &= !setgid;
        capset(&data)
    }

    /// Needs root: the holder's switch leaves every id the user's, only
    /// `CAP_SYS_ADMIN` effective and permitted (so a kernel that restricts
    /// unprivileged user namespaces lets it create one), `no_new_privs`
    /// set, and the user namespace it then creates is owned by the user
    /// (so the step's tasks, as the user, can enter it).
    #[test]
    fn the_holders_switch_keeps_only_sys_admin_for_its_user_namespace() {
        if crate::test_support::skip_unless_root(
            "the_holders_switch_keeps_only_sys_admin_for_its_user_namespace",
        ) {
            return;
        }
        let code = in_child(|| {
            if become_user_for_a_user_namespace(65534, 65534, &[65534]).is_err() {
                return 2;
            }
            let Ok(caps) = capget() else { return 3 };
            let only_admin = caps[0].effective == 1 << CAP_SYS_ADMIN
                && caps[0].permitted == 1 << CAP_SYS_ADMIN
                && caps[1].effective == 0
                && caps[1].permitted == 0;
            if !only_admin {
                return 4;
            }
            // SAFETY: plain get*id and prctl calls.
            let ids_and_nnp = unsafe {
                let (mut r, mut e, mut s) = (0, 0, 0);
                libc::getresuid(&mut r, &mut e, &mut s);
                [r, e, s] == [65534; 3] && libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1
            };
            if !ids_and_nnp {
                return 5;
            }
            // SAFETY: unshare with a flag only.
            if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
                return 6;
            }
            // NS_GET_OWNER_UID (linux/nsfs.h): the owner of the new namespace.
            const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
            let mut owner: libc::uid_t = u32::MAX;
            // SAFETY: opens a /proc path and asks the kernel for one uid,
            // written to a valid pointer.
            let owned_by_user = unsafe {
                let fd = libc::open(c"/proc/self/ns/user".as_ptr(), libc::O_RDONLY);
                fd >= 0 && libc::ioctl(fd, NS_GET_OWNER_UID, &mut owner) == 0
            };
            if !owned_by_user || owner != 65534 {
                return 7;
            }
            0
        });
        assert_eq!(code, 0, "see the check numbered {code} in the test");
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

    /// Runs `check` in a forked child (it changes the process's ids) and
    /// returns its exit code; 0 means every check held.
    fn in_child(check: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child makes raw system calls (and the allocation-free
        // paths of the functions under test) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = check();
            // SAFETY: ends the forked child without running the parent's handlers.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status}");
        libc::WEXITSTATUS(status)
    }

    /// Needs root: `become_user`, from full root and from slurmstepd's
    /// state (real uid 0, effective uid the user's), leaves all six ids and
    /// the groups the user's, and `no_new_privs` set.
    #[test]
    fn becoming_a_user_sets_every_id_and_no_new_privs() {
        if crate::test_support::skip_unless_root("becoming_a_user_sets_every_id_and_no_new_privs") {
            return;
        }
        for from_stepd in [false, true] {
            let code = in_child(|| {
                // SAFETY: plain set*id/get*id and prctl calls in the child.
                unsafe {
                    if from_stepd && (libc::setegid(65534) != 0 || libc::seteuid(65534) != 0) {
                        return 2;
                    }
                    if become_user(65534, 65534, &[65534]).is_err() {
                        return 3;
                    }
                    let (mut r, mut e, mut s) = (0, 0, 0);
                    libc::getresuid(&mut r, &mut e, &mut s);
                    let (mut rg, mut eg, mut sg) = (0, 0, 0);
                    libc::getresgid(&mut rg, &mut eg, &mut sg);
                    if [r, e, s, rg, eg, sg] != [65534; 6] {
                        return 4;
                    }
                    let mut groups = [0; 4];
                    if libc::getgroups(4, groups.as_mut_ptr()) != 1 || groups[0] != 65534 {
                        return 5;
                    }
                    if libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 {
                        return 6;
                    }
                }
                0
            });
            assert_eq!(code, 0, "from slurmstepd's ids: {from_stepd}");
        }
    }

    /// Needs root: a helper's child run as a user has `no_new_privs` (the
    /// pull, credentials and sbcast helpers), the podman client has not.
    #[test]
    fn helpers_run_as_a_user_have_no_new_privs() {
        if crate::test_support::skip_unless_root("helpers_run_as_a_user_have_no_new_privs") {
            return;
        }
        for keep_setuid in [false, true] {
            let mut command = Command::new("grep");
            command.args(["^NoNewPrivs:", "/proc/self/status"]);
            if keep_setuid {
                run_as_user_with_setuid_helpers(&mut command, 65534, 65534, vec![65534]);
            } else {
                run_as_user(&mut command, 65534, 65534, vec![65534]);
            }
            let out = command.output().unwrap();
            let want = if keep_setuid { "0" } else { "1" };
            let text = String::from_utf8_lossy(&out.stdout);
            assert_eq!(text.split_whitespace().nth(1), Some(want), "{text}");
        }
    }

    /// Needs root: acting as a user for a while gives root back after, and
    /// a switch that fails (no CAP_SETGID) runs nothing and still gives
    /// root back.
    #[test]
    fn acting_as_a_user_gives_root_back() {
        if crate::test_support::skip_unless_root("acting_as_a_user_gives_root_back") {
            return;
        }
        let code = in_child(|| {
            // SAFETY: get*id calls in the child.
            let ids = || unsafe { (libc::geteuid(), libc::getegid()) };
            let inside = as_effective_user(65534, 65534, &[65534], || Ok(ids()));
            if !matches!(inside, Ok((65534, 65534))) || ids() != (0, 0) {
                return 2;
            }
            if !thread_groups().is_ok_and(|g| g.is_empty()) {
                return 3;
            }
            if drop_setgid_capability().is_err() {
                return 4;
            }
            let mut ran = false;
            let failed = as_effective_user(65534, 65534, &[65534], || {
                ran = true;
                Ok(())
            });
            if failed.is_ok() || ran || ids().0 != 0 {
                return 5;
            }
            0
        });
        assert_eq!(code, 0);
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
