//! Passing open descriptors between processes: send them over a unix
//! socket (`SCM_RIGHTS`), take fresh copies of a queued message's
//! descriptors without taking the message ([`peek`]), and copy a
//! descriptor out of another process ([`copy_from_process`], as root).
//!
//! While a message with descriptors sits in a socket, the kernel keeps
//! their files open: a queued message holds namespaces and locks for as
//! long as the socket lives, whoever sent it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors one message carries here.
pub const MAX_FDS: usize = 16;

/// Sends `fds` (with one byte of data) over the unix socket `socket`.
pub fn send(socket: BorrowedFd<'_>, fds: &[RawFd]) -> io::Result<()> {
    if fds.is_empty() || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot send {} descriptors (1 to {MAX_FDS})", fds.len()),
        ));
    }
    let bytes = std::mem::size_of_val(fds);
    let mut control = control_buffer(bytes);
    let mut data = [1u8];
    let sent = with_message(&mut data, &mut control, |msg| {
        // SAFETY: the control buffer has CMSG_SPACE(bytes) bytes, so the
        // first header and its data lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(header),
                bytes,
            );
        }
        // SAFETY: msg points at buffers that live until sendmsg returns.
        unsafe { libc::sendmsg(socket.as_raw_fd(), msg, libc::MSG_NOSIGNAL) }
    });
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's own copies (close-on-exec) of the descriptors of the
/// first message queued in `socket`, in the order sent; the message stays
/// for the next reader. `WouldBlock` when no message is queued.
pub fn peek(socket: BorrowedFd<'_>) -> io::Result<Vec<OwnedFd>> {
    let mut control = control_buffer(MAX_FDS * std::mem::size_of::<RawFd>());
    let mut data = [0u8];
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    let mut fds = Vec::new();
    let (received, msg_flags) = with_message(&mut data, &mut control, |msg| {
        // SAFETY: msg points at buffers that live until recvmsg returns.
        let received = unsafe { libc::recvmsg(socket.as_raw_fd(), msg, flags) };
        if received < 0 {
            return (received, 0);
        }
        // SAFETY: the kernel filled the control buffer; the CMSG macros
        // walk only the headers inside msg_controllen.
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(msg);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET
                    && (*header).cmsg_type == libc::SCM_RIGHTS
                {
                    let len = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let data = libc::CMSG_DATA(header).cast::<RawFd>();
                    for i in 0..len / std::mem::size_of::<RawFd>() {
                        // SAFETY: the kernel installed these descriptors in
                        // this process for this call; nothing else owns them.
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                header = libc::CMSG_NXTHDR(msg, header);
            }
        }
        (received, msg.msg_flags)
    });
    if received < 0 {
        return Err(io::Error::last_os_error());
    }
    if msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("the message's descriptors were cut short"));
    }
    Ok(fds)
}

/// A zeroed control buffer with room for `bytes` of descriptors.
fn control_buffer(bytes: usize) -> Vec<u8> {
    // SAFETY: CMSG_SPACE only computes a size.
    vec![0u8; unsafe { libc::CMSG_SPACE(bytes as u32) } as usize]
}

/// Calls `f` with a message header over the one byte `data` and the
/// control buffer `control`, both alive for the call.
fn with_message<R>(
    data: &mut [u8; 1],
    control: &mut [u8],
    f: impl FnOnce(&mut libc::msghdr) -> R,
) -> R {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; the zeroed fields are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = control.len() as _;
    f(&mut msg)
}

/// A copy, in this process (close-on-exec), of descriptor `fd` of process
/// `pid` (`pidfd_getfd(2)`, Linux 5.6; root may copy from any process).
pub fn copy_from_process(pid: i32, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just created for this process alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    // SAFETY: pidfd_getfd takes two descriptor numbers and flags (0) and
    // returns a new descriptor or -1; no memory is passed.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd installed this descriptor (close-on-exec) in this
    // process for this call; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn each_peek_gets_copies_and_the_message_stays() {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        let ns = std::fs::File::open("/proc/self/ns/mnt").unwrap();
        let inode = ns.metadata().unwrap().ino();
        send(tx.as_fd(), &[ns.as_raw_fd()]).unwrap();
        drop(ns);
        let first = peek(rx.as_fd()).unwrap();
        let second = peek(rx.as_fd()).unwrap();
        assert_eq!((first.len(), second.len()), (1, 1));
        assert_ne!(first[0].as_raw_fd(), second[0].as_raw_fd());
        for fd in first.iter().chain(&second) {
            assert_eq!(nix::sys::stat::fstat(fd.as_raw_fd()).unwrap().st_ino, inode);
        }
        let e = send(tx.as_fd(), &[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn an_empty_socket_would_block() {
        let (_tx, rx) = UnixDatagram::pair().unwrap();
        let e = peek(rx.as_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn a_descriptor_is_copied_out_of_a_process() {
        let file = tempfile::tempfile().unwrap();
        let inode = file.metadata().unwrap().ino();
        let copy = copy_from_process(std::process::id() as i32, file.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), file.as_raw_fd());
        assert_eq!(
            nix::sys::stat::fstat(copy.as_raw_fd()).unwrap().st_ino,
            inode
        );
    }
}
