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

/// The 32-bit architecture the kernel also runs on this one (`int 0x80` on
/// x86_64): its calls have numbers of their own, the `*32` calls included,
/// and would otherwise pass the filter untouched.
#[cfg(target_arch = "x86_64")]
const COMPAT_ARCH: u32 = 0x4000_0003; // AUDIT_ARCH_I386
#[cfg(not(target_arch = "x86_64"))]
const COMPAT_ARCH: u32 = 0;

/// The calls of [`FAKED`] in the numbers of [`COMPAT_ARCH`]
/// (`<asm/unistd_32.h>`).
#[cfg(target_arch = "x86_64")]
const FAKED_COMPAT: [u32; 25] = [
    182, // chown
    16,  // lchown
    95,  // fchown
    212, // chown32
    198, // lchown32
    207, // fchown32
    298, // fchownat
    23,  // setuid
    46,  // setgid
    70,  // setreuid
    71,  // setregid
    164, // setresuid
    170, // setresgid
    81,  // setgroups
    138, // setfsuid
    139, // setfsgid
    213, // setuid32
    214, // setgid32
    203, // setreuid32
    204, // setregid32
    208, // setresuid32
    210, // setresgid32
    206, // setgroups32
    215, // setfsuid32
    216, // setfsgid32
];
#[cfg(not(target_arch = "x86_64"))]
const FAKED_COMPAT: [u32; 0] = [];

/// x32 calls come with this architecture's `AUDIT_ARCH` and the numbers of
/// the 64-bit calls plus this bit; it is cleared before the tests.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Instructions: load arch; native block (load nr, clear the x32 bit, one
/// test per call, allow); compat block (test arch, load nr, one test per
/// call); allow; succeed.
const NATIVE: usize = FAKED.len() + 3;
const LEN: usize = 2 + NATIVE + 2 + FAKED_COMPAT.len() + 2;

const BPF_ALU_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K

const fn statement(code: u16, k: u32) -> SockFilter {
    SockFilter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

/// The program: the calls of [`FAKED`] (this architecture, x32 included)
/// and of [`FAKED_COMPAT`] (the 32-bit one) return 0 at once; every other
/// call, and every call of any other architecture, passes.
const fn program() -> [SockFilter; LEN] {
    let succeed = LEN - 1;
    let mut program = [statement(BPF_RET_K, SECCOMP_RET_ALLOW); LEN];
    program[0] = statement(BPF_LD_W_ABS, DATA_ARCH);
    // This architecture: go on; else to the compat block.
    program[1] = SockFilter {
        code: BPF_JEQ_K,
        jt: 0,
        jf: NATIVE as u8,
        k: AUDIT_ARCH,
    };
    program[2] = statement(BPF_LD_W_ABS, DATA_NR);
    program[3] = statement(BPF_ALU_AND_K, !X32_SYSCALL_BIT);
    let mut i = 0;
    while i < FAKED.len() {
        let pc = 4 + i;
        program[pc] = SockFilter {
            code: BPF_JEQ_K,
            jt: (succeed - pc - 1) as u8,
            jf: 0,
            k: FAKED[i] as u32,
        };
        i += 1;
    }
    // program[4 + FAKED.len()]: allow (the initial value).
    let compat = 2 + NATIVE;
    program[compat] = SockFilter {
        code: BPF_JEQ_K,
        jt: 0,
        jf: (succeed - compat - 2) as u8, // to the final allow
        k: COMPAT_ARCH,
    };
    program[compat + 1] = statement(BPF_LD_W_ABS, DATA_NR);
    let mut i = 0;
    while i < FAKED_COMPAT.len() {
        let pc = compat + 2 + i;
        program[pc] = SockFilter {
            code: BPF_JEQ_K,
            jt: (succeed - pc - 1) as u8,
            jf: 0,
            k: FAKED_COMPAT[i],
        };
        i += 1;
    }
    program[LEN - 2] = statement(BPF_RET_K, SECCOMP_RET_ALLOW);
    program[succeed] = statement(BPF_RET_K, SECCOMP_RET_SUCCEED);
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
                BPF_ALU_AND_K => acc &= insn.k,
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
        // AUDIT_ARCH_ARM (32-bit), with a faked number of ours and of i386.
        for nr in [FAKED[0] as u32, 206] {
            assert_eq!(verdict(0x4000_0028, nr), SECCOMP_RET_ALLOW, "{nr}");
        }
    }

    /// The 32-bit and x32 forms of the faked calls are faked too:
    /// `setgroups32` cannot pass under another number.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn compat_and_x32_calls_are_faked() {
        for nr in FAKED_COMPAT {
            assert_eq!(verdict(COMPAT_ARCH, nr), SECCOMP_RET_SUCCEED, "i386 {nr}");
        }
        for nr in [3, 5, 11] {
            // read, open, execve of i386
            assert_eq!(verdict(COMPAT_ARCH, nr), SECCOMP_RET_ALLOW, "i386 {nr}");
        }
        for nr in FAKED {
            let x32 = nr as u32 | X32_SYSCALL_BIT;
            assert_eq!(verdict(AUDIT_ARCH, x32), SECCOMP_RET_SUCCEED, "x32 {nr}");
        }
    }

    /// Through the kernel: an `int 0x80` `setgroups32(0, NULL)` under the
    /// filter returns 0 and leaves the groups as they were.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_compat_setgroups32_changes_nothing() {
        // SAFETY: the child only makes raw syscalls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    // SAFETY: prctl with constant arguments.
                    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                        return 2;
                    }
                    let mut before = [0 as libc::gid_t; 64];
                    // SAFETY: room for 64 gids.
                    let n = unsafe { libc::getgroups(64, before.as_mut_ptr()) };
                    let one: libc::gid_t = 4242;
                    // Make sure there is a group to lose (as root), else
                    // keep the ones we have.
                    // SAFETY: one gid from a live variable.
                    let n = if unsafe { libc::setgroups(1, &one) } == 0 {
                        1
                    } else {
                        n
                    };
                    if install_remap_root_filter().is_err() {
                        return 3;
                    }
                    let ret: i64;
                    // SAFETY: i386 setgroups32(0, NULL) through int 0x80:
                    // eax = 206, ebx = 0 (swapped in and out: LLVM keeps
                    // rbx), ecx = 0; the kernel changes only eax.
                    unsafe {
                        std::arch::asm!(
                            "xchg rbx, {ebx}",
                            "int 0x80",
                            "xchg rbx, {ebx}",
                            ebx = inout(reg) 0i64 => _,
                            inlateout("rax") 206i64 => ret,
                            in("rcx") 0i64,
                            options(nostack),
                        );
                    }
                    if ret != 0 {
                        return 4;
                    }
                    // SAFETY: with size 0 getgroups only counts.
                    if unsafe { libc::getgroups(0, std::ptr::null_mut()) } != n {
                        return 5;
                    }
                    0
                })();
                // SAFETY: _exit is always safe.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
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
