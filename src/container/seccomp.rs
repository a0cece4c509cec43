//! The seccomp filter of `--container-remap-root`, as pyxis installs it: the
//! calls that change file owners or process ids succeed without effect, so
//! that package managers (which chown files and drop to service users) work
//! for a user who only appears as root.
//!
//! The filter is a fixed BPF program in static memory; installing it makes
//! one system call and allocates nothing, so it is safe after fork.

use std::io;

/// `struct sock_filter` of `<linux/filter.h>`.
#[derive(Clone, Copy)]
#[repr(C)]
struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// `struct sock_fprog` of `<linux/filter.h>`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ERRNO` with errno 0: the call returns 0 and does nothing.
const SECCOMP_RET_SUCCEED: u32 = 0x0005_0000;
const SECCOMP_SET_MODE_FILTER: libc::c_uint = 1;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: u32 = 0;

/// The calls made to succeed without effect (those of pyxis's filter that
/// this architecture has).
#[cfg(target_arch = "x86_64")]
const FAKED: [libc::c_long; 13] = [
    libc::SYS_chown,
    libc::SYS_fchown,
    libc::SYS_lchown,
    libc::SYS_fchownat,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
];
#[cfg(target_arch = "aarch64")]
const FAKED: [libc::c_long; 11] = [
    libc::SYS_fchown,
    libc::SYS_fchownat,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setreuid,
    libc::SYS_setregid,
    libc::SYS_setresuid,
    libc::SYS_setresgid,
    libc::SYS_setgroups,
    libc::SYS_setfsuid,
    libc::SYS_setfsgid,
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const FAKED: [libc::c_long; 0] = [];

/// Instructions: load arch, allow foreign arch, load nr, one test per call,
/// allow, succeed.
const LEN: usize = FAKED.len() + 5;

const fn statement(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The program: calls of another architecture and every call not in
/// [`FAKED`] pass; those in it return 0 at once.
const fn program() -> [SockFilter; LEN] {
    let mut program = [statement(BPF_RET_K, SECCOMP_RET_ALLOW); LEN];
    program[0] = statement(BPF_LD_W_ABS, DATA_ARCH);
    // Same architecture: go on; else jump to the final "allow".
    program[1] = SockFilter {
        code: BPF_JEQ_K,
        jt: 0,
        jf: (FAKED.len() + 1) as u8,
        k: AUDIT_ARCH,
    };
    program[2] = statement(BPF_LD_W_ABS, DATA_NR);
    let mut i = 0;
    while i < FAKED.len() {
        // A match jumps over the remaining tests and the "allow".
        program[3 + i] = SockFilter {
            code: BPF_JEQ_K,
            jt: (FAKED.len() - i) as u8,
            jf: 0,
            k: FAKED[i] as u32,
        };
        i += 1;
    }
    program[LEN - 2] = statement(BPF_RET_K, SECCOMP_RET_ALLOW);
    program[LEN - 1] = statement(BPF_RET_K, SECCOMP_RET_SUCCEED);
    program
}

static PROGRAM: [SockFilter; LEN] = program();

/// Installs the filter on the calling thread (and what it execs).
///
/// Needs CAP_SYS_ADMIN in the current user namespace, which a process has
/// right after joining the container's: no `no_new_privs` is set, so set-id
/// programs keep working where they can. Raw syscall only: safe after fork.
pub(crate) fn install_remap_root_filter() -> io::Result<()> {
    if AUDIT_ARCH == 0 {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let prog = SockFprog {
        len: LEN as u16,
        filter: PROGRAM.as_ptr(),
    };
    // SAFETY: `prog` points at a valid, static BPF program of `len`
    // instructions; the kernel copies it during the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const SockFprog,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program on (arch, nr) the way the kernel would.
    fn verdict(arch: u32, nr: u32) -> u32 {
        let mut acc = 0;
        let mut pc = 0;
        loop {
            let insn = &PROGRAM[pc];
            match insn.code {
                BPF_LD_W_ABS => acc = if insn.k == DATA_ARCH { arch } else { nr },
                BPF_JEQ_K => {
                    pc += usize::from(if acc == insn.k { insn.jt } else { insn.jf });
                }
                BPF_RET_K => return insn.k,
                other => panic!("unexpected instruction {other:#x}"),
            }
            pc += 1;
        }
    }

    #[test]
    fn faked_calls_succeed_and_others_pass() {
        for nr in FAKED {
            assert_eq!(verdict(AUDIT_ARCH, nr as u32), SECCOMP_RET_SUCCEED, "{nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_openat, libc::SYS_getuid] {
            assert_eq!(verdict(AUDIT_ARCH, nr as u32), SECCOMP_RET_ALLOW, "{nr}");
        }
    }

    #[test]
    fn other_architectures_pass() {
        assert_eq!(verdict(0x4000_0003, FAKED[0] as u32), SECCOMP_RET_ALLOW);
    }

    #[test]
    fn filter_makes_chown_a_no_op() {
        // In a child, so the test process keeps no filter. Without
        // CAP_SYS_ADMIN set no_new_privs first, as the kernel requires.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let path = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: the child only makes raw syscalls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    // SAFETY: prctl with constant arguments.
                    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                        return 2;
                    }
                    if install_remap_root_filter().is_err() {
                        return 3;
                    }
                    // SAFETY: a valid NUL-terminated path.
                    match unsafe { libc::chown(path.as_ptr(), 4242, 4242) } {
                        0 => 0,
                        _ => 4,
                    }
                })();
                // SAFETY: _exit is always safe.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
                use std::os::unix::fs::MetadataExt;
                assert_ne!(std::fs::metadata(&file).unwrap().uid(), 4242);
            }
        }
    }
}
