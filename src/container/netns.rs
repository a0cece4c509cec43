//! A new network namespace starts with its loopback interface down; tasks
//! (MPI, NCCL, servers on localhost) expect it up.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// `struct ifreq` of `<net/if.h>`, with the flags member of its union.
#[repr(C)]
struct IfReqFlags {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    /// The rest of the 24-byte union.
    _pad: [u8; 22],
}

/// Sets `lo` of the calling process's network namespace up
/// (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP); needs CAP_NET_ADMIN in the
/// namespace's owning user namespace.
pub(crate) fn bring_loopback_up() -> io::Result<()> {
    // SAFETY: socket takes plain integers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut request = IfReqFlags {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    for (slot, byte) in request.name.iter_mut().zip(b"lo") {
        *slot = *byte as libc::c_char;
    }
    for (call, set_up) in [(libc::SIOCGIFFLAGS, false), (libc::SIOCSIFFLAGS, true)] {
        if set_up {
            request.flags |= libc::IFF_UP as libc::c_short;
        }
        // SAFETY: `request` is a valid ifreq for these two ioctls and
        // outlives the call; the descriptor is open.
        let ret = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                call,
                &mut request as *mut IfReqFlags,
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
